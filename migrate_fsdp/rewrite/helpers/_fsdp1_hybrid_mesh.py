"""MF106 inserts this where FSDP1's HYBRID_SHARD took a 2-D device_mesh of the
user's."""

from torch.distributed.device_mesh import DeviceMesh


def _fsdp1_hybrid_mesh(mesh):
    """FSDP1 read a 2-D device_mesh as (replicate, shard) by position; fully_shard
    wants those dims named, so a mesh without names is rebuilt over the same ranks
    with them (new process groups, once)."""
    if mesh.ndim != 2 or mesh.mesh_dim_names is not None:
        return mesh
    return DeviceMesh(
        mesh.device_type, mesh.mesh, mesh_dim_names=("replicate", "shard")
    )
