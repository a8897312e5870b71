"""MF106 inserts this where FSDP1's NO_SHARD ran over a process group or 1-D device mesh
of the user's (data-parallel ranks beside model-parallel ones)."""

import torch
from torch.distributed import (
    get_process_group_ranks,
    get_world_size,
    new_subgroups_by_enumeration,
)
from torch.distributed.device_mesh import DeviceMesh


def _fsdp1_replicate_mesh(group, device_type=None):
    """fully_shard's mesh for FSDP1's NO_SHARD over `group` (or a 1-D mesh's group):
    whole parameters on each rank, gradients averaged over the group. fully_shard
    replicates over a 2-D mesh's first dimension and shards over its second, here one
    rank each; every rank calls this, as each makes the one-rank groups with all."""
    if isinstance(group, DeviceMesh):
        group, device_type = group.get_group(), group.device_type
    own, _ = new_subgroups_by_enumeration([[rank] for rank in range(get_world_size())])
    ranks = torch.tensor(get_process_group_ranks(group)).view(-1, 1)
    return DeviceMesh.from_group(
        [group, own], device_type, mesh=ranks, mesh_dim_names=("replicate", "shard")
    )
