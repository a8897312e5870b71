"""MF202 inserts this for `model.load_state_dict(sd)` in code an FSDP1 model reaches
together with other models (a `load(model, path)` serving FSDP, DDP and single-device
runs): FSDP1 loaded a full state dict on every rank there by default, which FSDP2 does
only through set_model_state_dict; other modules keep their own."""

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from migrate_fsdp.rewrite.helpers.fsdp2_reshard import fsdp2_reshard


def fsdp2_load_state_dict(module, state_dict, strict=True):
    """`module.load_state_dict(state_dict, strict)`: each rank gives full tensors where
    FSDP2 shards `module`, as with FSDP1, and keeps its shards of them."""
    if any(isinstance(part, FSDPModule) for part in module.modules()):
        fsdp2_reshard(module)  # an evaluation may have left it unsharded
        return set_model_state_dict(
            module,
            state_dict,
            options=StateDictOptions(full_state_dict=True, strict=strict),
        )
    return module.load_state_dict(state_dict, strict=strict)
