"""MF203 inserts this where FSDP1's optimizer state dict was loaded into an optimizer
(`optim.load_state_dict(FSDP.optim_state_dict_to_load(model, optim, osd))`)."""

from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

from migrate_fsdp.rewrite.helpers.fsdp1_unshared_steps import fsdp1_unshared_steps
from migrate_fsdp.rewrite.helpers.fsdp2_reshard import fsdp2_reshard


def fsdp2_set_optimizer_state_dict(model, optim, optim_state_dict, options=None):
    """FSDP1's load of `optim_state_dict` into `optim`, for an FSDP2 model.

    FSDP1's `optim.load_state_dict` took the saved param groups whole. FSDP2's
    setter fails on a group setting `optim` lacks (an LR scheduler's
    `initial_lr`, saved, with no scheduler built yet: KeyError), so those are
    added first, and the load sets them. It also cannot start the empty state
    of an optimizer whose parameters still hold gradients, so they are set
    aside meanwhile. A parameter the checkpoint holds no state for (frozen
    when it was saved) starts afresh, as under FSDP1, rather than failing the
    load (`strict=False`).
    """
    fsdp2_reshard(model)  # an evaluation may have left it unsharded
    saved = optim_state_dict.get("param_groups", ()) if optim_state_dict else ()
    for group, saved_group in zip(optim.param_groups, saved):
        for key, value in saved_group.items():
            group.setdefault(key, value)
    params = [param for group in optim.param_groups for param in group["params"]]
    held = [] if optim.state else [param for param in params if param.grad is not None]
    grads = {param: param.grad for param in held}
    for param in grads:
        param.grad = None
    try:
        set_optimizer_state_dict(
            model,
            optim,
            fsdp1_unshared_steps(optim_state_dict),
            options=StateDictOptions(**{**vars(options or StateDictOptions()), "strict": False}),
        )
    finally:
        for param, grad in grads.items():
            param.grad = grad
