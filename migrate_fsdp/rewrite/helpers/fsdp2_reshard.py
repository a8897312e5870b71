"""MF214 inserts this where parameters of a model are changed under no_grad, MF204
before a summon's body reads them: where FSDP1 showed the sharded ones."""

from torch.distributed.fsdp import FSDPModule


def fsdp2_reshard(module):
    """Every FSDP module in `module` back on its sharded parameters, as FSDP1 left them
    after each forward.

    FSDP2 keeps the root's parameters (and those of modules sharded with
    reshard_after_forward=False) unsharded after a forward until a backward,
    which a model run only under no_grad (an EMA teacher) never has.
    """
    for submodule in module.modules():
        if isinstance(submodule, FSDPModule):
            submodule.reshard()
