"""MF202/MF203 insert this where FSDP1's FULL_STATE_DICT had `offload_to_cpu` !=
`rank0_only`, a pair FSDP2's StateDictOptions cannot say, or `rank0_only` on a model
sharded over part of the world (StateDictOptions means the world's rank 0)."""

from torch import Tensor
from torch.distributed import get_rank
from torch.distributed.tensor import DTensor


def fsdp2_full_state_dict(state_dict, offload_to_cpu, rank0_only):
    """FSDP1's FULL_STATE_DICT from an FSDP2 state dict: every DTensor gathered whole
    (a collective, one at a time), moved to CPU with `offload_to_cpu`; ranks other
    than 0 get {} with `rank0_only`, dropping each gathered tensor at once. That is
    FSDP1's rank 0 of the group the model was sharded over: the mesh's first rank
    along its shard (last) dimension, so every rank with NO_SHARD."""
    first = [None]  # whether this rank keeps the state dict, known at the first DTensor

    def full(value):
        if isinstance(value, DTensor):
            mesh = value.device_mesh
            value = value.full_tensor()
            if rank0_only and first[0] is None:
                first[0] = mesh.get_local_rank(mesh.ndim - 1) == 0
            if rank0_only and not first[0]:
                return None
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
    return result if (get_rank() == 0 if first[0] is None else first[0]) else {}
