"""MF203 inserts this where the dict FSDP1's `optim_state_dict_to_load` returned is
loaded later, not at once
(`if fsdp: osd = FSDP.optim_state_dict_to_load(model, optim, osd)` then
`optim.load_state_dict(osd)`)."""

from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

from migrate_fsdp.rewrite.helpers.fsdp2_reshard import fsdp2_reshard


def fsdp2_optim_state_dict_to_load(model, optim, optim_state_dict, options=None):
    """FSDP1's `optim_state_dict_to_load` for an FSDP2 model: FSDP2's setter loads the
    state into `optim` itself; what it returns is `optim`'s own state dict, which the
    caller's `optim.load_state_dict` loads again unchanged."""
    fsdp2_reshard(model)  # an evaluation may have left it unsharded
    set_optimizer_state_dict(model, optim, optim_state_dict, options=options)
    return optim.state_dict()
