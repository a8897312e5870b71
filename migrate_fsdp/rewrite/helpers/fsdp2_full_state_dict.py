"""MF202/MF203 insert this where FSDP1's FULL_STATE_DICT had `offload_to_cpu` != `rank0_only`,
a pair FSDP2's StateDictOptions cannot say."""

from torch import Tensor
from torch.distributed import get_rank
from torch.distributed.tensor import DTensor


def fsdp2_full_state_dict(state_dict, offload_to_cpu, rank0_only):
    """FSDP1's FULL_STATE_DICT from an FSDP2 state dict: every DTensor gathered whole (a collective,
    one at a time), moved to CPU with `offload_to_cpu`; ranks other than 0 get {} with `rank0_only`:
    FSDP1's rank 0, of the group the model is sharded over (its mesh's last dimension), not the world's."""
    meshes = []

    def full(value):
        if isinstance(value, DTensor):
            meshes.append(value.device_mesh)
            value = value.full_tensor()
        if isinstance(value, Tensor) and offload_to_cpu:
            return value.cpu()
        if isinstance(value, dict):
            return {key: full(item) for key, item in value.items()}
        if isinstance(value, list):
            return [full(item) for item in value]
        return value

    result = full(state_dict)
    if not rank0_only:
        return result
    rank = meshes[0].get_local_rank(meshes[0].ndim - 1) if meshes else get_rank()
    return result if rank == 0 else {}
