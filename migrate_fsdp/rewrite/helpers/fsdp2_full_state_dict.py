"""MF202/MF203 insert this where FSDP1's FULL_STATE_DICT had `offload_to_cpu` != `rank0_only`,
a pair FSDP2's StateDictOptions cannot say."""

from torch import Tensor
from torch.distributed import get_rank
from torch.distributed.tensor import DTensor


def fsdp2_full_state_dict(state_dict, offload_to_cpu, rank0_only):
    """FSDP1's FULL_STATE_DICT from an FSDP2 state dict: every DTensor gathered whole (a collective,
    one at a time), moved to CPU with `offload_to_cpu`; ranks other than 0 get {} with `rank0_only`."""

    def full(value):
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if isinstance(value, Tensor) and offload_to_cpu:
            return value.cpu()
        if isinstance(value, dict):
            return {key: full(item) for key, item in value.items()}
        if isinstance(value, list):
            return [full(item) for item in value]
        return value

    result = full(state_dict)
    return result if not rank0_only or get_rank() == 0 else {}
