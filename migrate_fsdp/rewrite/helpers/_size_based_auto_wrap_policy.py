"""MF102 inserts this for FSDP1's size_based_auto_wrap_policy, which FSDP2 does not
have."""

import torch


def _size_based_auto_wrap_policy(
    module,
    recurse,
    nonwrapped_numel,
    min_num_params=int(1e8),
    force_leaf_modules=None,
    exclude_wrap_modules=None,
):
    """FSDP1's size_based_auto_wrap_policy (torch.distributed.fsdp.wrap), same
    defaults."""
    leaves = (
        (torch.nn.MultiheadAttention,)
        if force_leaf_modules is None
        else tuple(force_leaf_modules)
    )
    excluded = (
        (torch.nn.ModuleList, torch.nn.ModuleDict)
        if exclude_wrap_modules is None
        else tuple(exclude_wrap_modules)
    )
    is_large = nonwrapped_numel >= min_num_params
    return is_large and not isinstance(module, leaves if recurse else excluded)
