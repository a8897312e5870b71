"""MF202 inserts this for `model.state_dict()` in code an FSDP1 model reaches together
with other models (a `save(model)` serving FSDP, DDP and single-device runs): FSDP1's
default there was a full state dict on every rank, which FSDP2 gives only through
get_model_state_dict; other modules keep their own state_dict()."""

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
)
from torch.distributed.fsdp import FSDPModule


def fsdp2_state_dict(module):
    """`module.state_dict()`: full tensors on every rank where FSDP2 shards `module`, as
    FSDP1 gave."""
    if any(isinstance(part, FSDPModule) for part in module.modules()):
        return get_model_state_dict(
            module, options=StateDictOptions(full_state_dict=True)
        )
    return module.state_dict()
