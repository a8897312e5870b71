"""MF106 inserts this where FSDP1's process_group may vary at run time: a parameter
that may be None (Wan2.1's `shard_model(..., process_group=None)`), or one group or
HYBRID_SHARD's (intra-node, inter-node) pair (LLaMA2-Accessory's data-parallel groups)."""

import torch
from torch.distributed import all_gather, get_process_group_ranks, get_world_size
from torch.distributed.device_mesh import DeviceMesh


def _fsdp1_group_mesh(process_group, device_type):
    """The device mesh of FSDP1's process_group: None for None (FSDP1's default group,
    which `_fsdp1_sharding_over` builds by the strategy), a 1-D mesh of one group's
    ranks, a 2-D (replicate, shard) mesh of an (intra-node, inter-node) pair, its
    layout gathered from every rank's intra-node group."""
    if process_group is None:
        return None
    if not isinstance(process_group, tuple):
        return DeviceMesh.from_group(process_group, device_type)
    intra, inter = process_group
    device = torch.device(device_type)
    if device_type != "cpu":  # the collective's own device, as FSDP1's device handle
        device = torch.device(device_type, torch.get_device_module(device_type).current_device())
    row = torch.tensor(get_process_group_ranks(intra), device=device)
    rows = [torch.empty_like(row) for _ in range(get_world_size())]
    all_gather(rows, row)
    layout = [rows[rank].tolist() for rank in get_process_group_ranks(inter)]
    return DeviceMesh.from_group(
        [inter, intra], device_type, mesh=layout, mesh_dim_names=("replicate", "shard")
    )
