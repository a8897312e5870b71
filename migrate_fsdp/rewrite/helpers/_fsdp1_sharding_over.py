"""MF106 inserts this where FSDP1's sharding_strategy is known only at run time and the
model is sharded over a device mesh or process group of the user's."""

from migrate_fsdp.rewrite.helpers._fsdp1_hybrid_mesh import _fsdp1_hybrid_mesh
from migrate_fsdp.rewrite.helpers._fsdp1_replicate_mesh import _fsdp1_replicate_mesh
from migrate_fsdp.rewrite.helpers._fsdp1_sharding import _fsdp1_sharding
from migrate_fsdp.rewrite.helpers._fsdp1_strategy_name import _fsdp1_strategy_name


def _fsdp1_sharding_over(strategy, mesh, device_type=None):
    """fully_shard's mesh and reshard_after_forward for FSDP1's sharding_strategy (a
    member or its name) over `mesh` (the user's, or a process group's 1-D one; None:
    FSDP1's default group, as `_fsdp1_sharding` on `device_type`).

    As FSDP1 did: FULL_SHARD and SHARD_GRAD_OP shard over it, HYBRID_SHARD /
    _HYBRID_SHARD_ZERO2 read a 2-D mesh as (replicate, shard), NO_SHARD
    replicates over a 1-D mesh's group.
    """
    if mesh is None:
        return _fsdp1_sharding(strategy, device_type)
    name = _fsdp1_strategy_name(strategy)
    if name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
        mesh = _fsdp1_hybrid_mesh(mesh)
    elif name == "NO_SHARD":
        # FSDP1 read one group from it, which a 2-D mesh does not have
        if mesh.ndim != 1:
            raise NotImplementedError(
                "NO_SHARD over a 2-D device mesh: "
                "pass fully_shard a 2-D (replicate, 1) mesh"
            )
        mesh = _fsdp1_replicate_mesh(mesh)
    kwargs = {"mesh": mesh}
    if name in ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2"):
        kwargs["reshard_after_forward"] = False
    return kwargs
