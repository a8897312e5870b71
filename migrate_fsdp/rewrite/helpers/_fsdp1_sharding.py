"""MF106 inserts this where FSDP1's sharding_strategy is known only at run time."""

import torch
from torch.distributed import get_world_size
from torch.distributed.device_mesh import init_device_mesh

from migrate_fsdp.rewrite.helpers._fsdp1_strategy_name import _fsdp1_strategy_name


def _fsdp1_sharding(strategy, device_type=None):
    """fully_shard's mesh and reshard_after_forward for FSDP1's sharding_strategy (a
    member or its name) over the default group.

    As FSDP1 did: FULL_SHARD shards over every rank, SHARD_GRAD_OP keeps the
    parameters unsharded after forward, HYBRID_SHARD / _HYBRID_SHARD_ZERO2
    shard within a node and replicate across nodes, NO_SHARD replicates. The
    mesh is on `device_type` (FSDP1's device_id's) when given, else on the
    accelerator, as fully_shard's default mesh.
    """
    name = _fsdp1_strategy_name(strategy)
    accelerator = torch.accelerator.current_accelerator()
    given = device_type
    device_type = device_type or (accelerator.type if accelerator else "cpu")
    world_size = get_world_size()
    kwargs = {}
    if given is not None and name in ("FULL_SHARD", "SHARD_GRAD_OP"):
        # not fully_shard's default mesh: a CPU program stays on CPU where CUDA is
        kwargs["mesh"] = init_device_mesh(device_type, (world_size,))
    elif name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
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
