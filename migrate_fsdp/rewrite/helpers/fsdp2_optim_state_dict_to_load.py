"""MF203 inserts this where the dict FSDP1's `optim_state_dict_to_load` returned is
loaded later, not at once
(`if fsdp: osd = FSDP.optim_state_dict_to_load(model, optim, osd)` then
`optim.load_state_dict(osd)`)."""

from migrate_fsdp.rewrite.helpers.fsdp2_set_optimizer_state_dict import (
    fsdp2_set_optimizer_state_dict,
)


def fsdp2_optim_state_dict_to_load(model, optim, optim_state_dict, options=None):
    """FSDP1's `optim_state_dict_to_load` for an FSDP2 model: FSDP2's setter loads the
    state into `optim` itself; what it returns is `optim`'s own state dict, which the
    caller's `optim.load_state_dict` loads again unchanged."""
    fsdp2_set_optimizer_state_dict(model, optim, optim_state_dict, options=options)
    return optim.state_dict()
