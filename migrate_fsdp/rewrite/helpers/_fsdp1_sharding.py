"""MF106 inserts this where FSDP1's sharding_strategy is known only at run time."""

import torch
from torch.distributed import get_world_size
from torch.distributed.device_mesh import init_device_mesh

from migrate_fsdp.rewrite.helpers._fsdp1_hybrid_mesh import _fsdp1_hybrid_mesh
from migrate_fsdp.rewrite.helpers._fsdp1_replicate_mesh import _fsdp1_replicate_mesh


def _fsdp1_sharding(strategy, device_type=None, mesh=None):
    """fully_shard's mesh and reshard_after_forward for FSDP1's sharding_strategy (a
    member or its name).

    As FSDP1 did: FULL_SHARD keeps FSDP2's defaults, SHARD_GRAD_OP keeps the
    parameters unsharded after forward, HYBRID_SHARD / _HYBRID_SHARD_ZERO2
    shard within a node and replicate across nodes, NO_SHARD replicates.
    """
    name = "FULL_SHARD" if strategy is None else getattr(strategy, "name", strategy)
    if name not in (
        "FULL_SHARD",
        "SHARD_GRAD_OP",
        "HYBRID_SHARD",
        "_HYBRID_SHARD_ZERO2",
        "NO_SHARD",
    ):
        raise ValueError(f"unknown FSDP1 sharding strategy {strategy!r}")
    device_type = device_type or torch.accelerator.current_accelerator().type
    world_size = get_world_size()
    if name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2") and mesh is None:
        # FSDP1's device handle: 1 for CPU
        per_node = torch.get_device_module(device_type).device_count()
        mesh = init_device_mesh(
            device_type,
            (world_size // per_node, per_node),
            mesh_dim_names=("replicate", "shard"),
        )
    elif name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        mesh = _fsdp1_hybrid_mesh(mesh)
    elif name == "NO_SHARD" and mesh is None:
        mesh = init_device_mesh(
            device_type, (world_size, 1), mesh_dim_names=("replicate", "shard")
        )
    elif name == "NO_SHARD":
        # FSDP1 read one group from it, which a 2-D mesh does not have
        if mesh.ndim != 1:
            raise NotImplementedError(
                "NO_SHARD over a 2-D device mesh: "
                "pass fully_shard a 2-D (replicate, 1) mesh"
            )
        mesh = _fsdp1_replicate_mesh(mesh)
    kwargs = {} if mesh is None else {"mesh": mesh}
    if name in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        kwargs["reshard_after_forward"] = False
    return kwargs
