"""MF106 inserts this where FSDP1's sharding_strategy is known only at run time."""

import torch
from torch.distributed import get_world_size
from torch.distributed.device_mesh import init_device_mesh

from migrate_fsdp.rewrite.helpers._fsdp1_strategy_name import _fsdp1_strategy_name


def _fsdp1_sharding(strategy, device_type=None):
    """fully_shard's mesh and reshard_after_forward for FSDP1's sharding_strategy (a
    member or its name) over the default group.

    As FSDP1 did: FULL_SHARD keeps FSDP2's defaults, SHARD_GRAD_OP keeps the
    parameters unsharded after forward, HYBRID_SHARD / _HYBRID_SHARD_ZERO2
    shard within a node and replicate across nodes, NO_SHARD replicates.
    """
    name = _fsdp1_strategy_name(strategy)
    device_type = device_type or torch.accelerator.current_accelerator().type
    world_size = get_world_size()
    kwargs = {}
    if name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        # FSDP1's device handle: 1 for CPU
        per_node = torch.get_device_module(device_type).device_count()
        kwargs["mesh"] = init_device_mesh(
            device_type,
            (world_size // per_node, per_node),
            mesh_dim_names=("replicate", "shard"),
        )
    elif name == "NO_SHARD":
        kwargs["mesh"] = init_device_mesh(
            device_type, (world_size, 1), mesh_dim_names=("replicate", "shard")
        )
    if name in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        kwargs["reshard_after_forward"] = False
    return kwargs
