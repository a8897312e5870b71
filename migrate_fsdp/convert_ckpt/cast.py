"""`--dtype`: model tensors cast to bf16/fp16/fp32 block by block, so memory stays bounded.

Casting is arithmetic (rounding to nearest even), so this is the one place
torch itself runs: it converts a block of rows at a time, exactly as
`tensor.to(dtype)` would for the whole tensor.
"""

import math
from collections.abc import Iterator

from migrate_fsdp.convert_ckpt.fileio import iter_blocks
from migrate_fsdp.convert_ckpt.tensors import Rows, Segment, TensorRef

BLOCK = 32 << 20  # source bytes converted at a time


class CastTensor(TensorRef):
    def __init__(self, source: TensorRef, dtype):
        self.source, self.dtype, self.shape = source, dtype, source.shape

    def segments(self, rows: Rows = None) -> Iterator[Segment]:
        import torch

        if not self.numel:
            return
        if rows is None:
            rows = (0, self.shape[0]) if self.shape else None
        row_elems = math.prod(self.shape[1:]) if self.shape else 1
        step = max(1, BLOCK // max(1, row_elems * self.source.dtype.itemsize))
        first, last = rows if rows is not None else (0, 1)
        source_dtype, target_dtype = getattr(torch, self.source.dtype.name), getattr(torch, self.dtype.name)
        for start in range(first, last, step):
            block = (start, min(last, start + step)) if self.shape else None
            data = bytearray().join(iter_blocks(self.source.segments(block), BLOCK))
            values = torch.frombuffer(data, dtype=source_dtype) if data else torch.empty(0, dtype=source_dtype)
            converted = values.to(target_dtype).view(torch.uint8).numpy()
            yield memoryview(converted)


def cast_model(model: dict, target) -> dict:
    """Floating-point model tensors in `target` precision; other entries unchanged."""
    return {
        key: (
            CastTensor(value, target)
            if isinstance(value, TensorRef) and value.dtype.floating and value.dtype != target
            else value
        )
        for key, value in model.items()
    }
