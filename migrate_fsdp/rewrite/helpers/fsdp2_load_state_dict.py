"""MF202 inserts this for `model.load_state_dict(sd)` in code an FSDP1 model reaches
together with other models (a `load(model, path)` serving FSDP, DDP and single-device
runs): FSDP1 loaded a full state dict on every rank there by default, which FSDP2 does
only through set_model_state_dict; other modules keep their own. Also where a full
load's result is read (`missing_keys` of a `strict=False` load of adapter weights)."""

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from migrate_fsdp.rewrite.helpers.fsdp2_reshard import fsdp2_reshard


def fsdp2_load_state_dict(module, state_dict, strict=True):
    """`module.load_state_dict(state_dict, strict)`: each rank gives full tensors where
    FSDP2 shards `module`, as with FSDP1, and keeps its shards of them.

    set_model_state_dict fills the keys the dict lacks with the module's own values
    (so its result never lists them missing, and strict loads of a partial dict pass)
    and puts the shards into the dict it is given: it gets a copy, and the result and
    the strict check are FSDP1's.
    """
    if not any(isinstance(part, FSDPModule) for part in module.modules()):
        return module.load_state_dict(state_dict, strict=strict)
    missing = [key for key in module.state_dict() if key not in state_dict]
    if strict and missing:
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(module).__name__}: "
            f"missing keys {missing}"
        )
    fsdp2_reshard(module)  # an evaluation may have left it unsharded
    result = set_model_state_dict(
        module,
        dict(state_dict),
        options=StateDictOptions(full_state_dict=True, strict=strict),
    )
    return result._replace(missing_keys=missing)
