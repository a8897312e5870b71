"""MF207 inserts this for FSDP1's `FSDP.fsdp_modules(module, root_only=True)`, which
FSDP2 does not have."""

from torch.distributed.fsdp import FSDPModule


def fsdp2_root_modules(module):
    """FSDP1's `FSDP.fsdp_modules(module, root_only=True)` for FSDP2: the outermost
    FSDP modules."""
    if isinstance(module, FSDPModule):
        return [module]
    return [root for child in module.children() for root in fsdp2_root_modules(child)]
