"""Inserted where FSDP1 showed a model's sharded parameters and FSDP2 may still hold
them unsharded after a forward: before an in-place change under no_grad (MF214), a
summon's body (MF204), and the state-dict calls that fail on unsharded parameters
(migrate_fsdp/rewrite/reshard.py)."""

from torch.distributed.fsdp import FSDPModule


def fsdp2_reshard(module):
    """Every FSDP module in `module` back on its sharded parameters, as FSDP1 left them
    after each forward.

    FSDP2 keeps the root's parameters (and those of modules sharded with
    reshard_after_forward=False) unsharded after a forward until a backward,
    which an evaluation under no_grad, or a model only run so (an EMA teacher),
    never has.
    """
    for submodule in module.modules():
        if isinstance(submodule, FSDPModule):
            submodule.reshard()
