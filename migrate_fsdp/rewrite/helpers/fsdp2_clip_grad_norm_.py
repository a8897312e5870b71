"""MF205 inserts this where FSDP1's `model.clip_grad_norm_()` result is used: FSDP1
returned a plain tensor."""

from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grad_norm_


def fsdp2_clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """FSDP1's `model.clip_grad_norm_()` for an FSDP2 model: clips in place, returns
    the global norm as a tensor."""
    total_norm = clip_grad_norm_(parameters, max_norm, norm_type)
    return total_norm.full_tensor() if isinstance(total_norm, DTensor) else total_norm
