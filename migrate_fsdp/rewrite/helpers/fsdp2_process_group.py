"""Inserted where code reads a model's `process_group` (MF209), as fms-fsdp's checkpointer does to hand it to
torch.distributed.checkpoint: an FSDP2 model keeps no such attribute, but the mesh its parameters are DTensors on
holds the same group."""

from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def fsdp2_process_group(module):
    """The process group FSDP1 sharded `module` over: for an FSDP2 module, that of its mesh's
    shard (last) dimension, or with NO_SHARD's (world, 1) mesh that of the replicas (FSDP1
    kept every rank in one group); any other module's own (an FSDP1 or DDP model's)."""
    if not isinstance(module, FSDPModule):
        return module.process_group
    mesh = next(p.device_mesh for p in module.parameters() if isinstance(p, DTensor))
    if mesh.ndim == 2 and mesh.size(1) == 1:
        return mesh.get_group(0)
    return mesh.get_group(mesh.ndim - 1)
