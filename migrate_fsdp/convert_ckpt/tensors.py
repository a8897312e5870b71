"""Tensors as references to bytes in files, so a conversion never holds a checkpoint in memory.

A tensor is a dtype, a shape and a way to produce its elements in row-major
order as *segments*: `FileSpan`s (byte ranges of a source file, copied by the
kernel) or in-memory buffers (only where bytes must be rearranged or computed:
a non-contiguous view, a tensor reassembled from non-row chunks, a cast).
`rows=(a, b)` restricts a tensor to rows a..b-1 of dim 0, which is how FSDP2
shards (torch.chunk along dim 0).
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass

from migrate_fsdp.convert_ckpt.dtypes import DType
from migrate_fsdp.convert_ckpt.errors import ConvertError


@dataclass(frozen=True)
class FileSpan:
    path: str
    offset: int
    length: int


Segment = FileSpan | memoryview
Rows = tuple[int, int] | None

_UINT_OF_SIZE = {1: "u1", 2: "u2", 4: "u4", 8: "u8", 16: "V16"}


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class TensorRef:
    __slots__ = ()  # a checkpoint may hold a million tensors: no per-instance dict where the subclasses avoid one
    dtype: DType
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def rows_nbytes(self, rows: Rows) -> int:
        if rows is None:
            return self.nbytes
        return (rows[1] - rows[0]) * math.prod(self.shape[1:]) * self.dtype.itemsize

    def segments(self, rows: Rows = None) -> Iterator[Segment]:
        """The elements (of rows a..b-1 when given), row-major, as byte segments."""
        raise NotImplementedError

    def array(self, rows: Rows = None):
        """The elements as a numpy array of same-size unsigned ints (bytes, not values)."""
        import numpy as np

        shape = self.shape if rows is None else (rows[1] - rows[0], *self.shape[1:])
        flat = np.empty(math.prod(shape) * self.dtype.itemsize, dtype=np.uint8)
        position = 0
        for segment in self.segments(rows):
            data = read_segment(segment)
            flat[position : position + len(data)] = np.frombuffer(data, dtype=np.uint8)
            position += len(data)
        return flat.view(_UINT_OF_SIZE[self.dtype.itemsize]).reshape(shape)


def read_segment(segment: Segment) -> memoryview:
    if isinstance(segment, memoryview):
        return segment
    from migrate_fsdp.convert_ckpt.fileio import pread_exact

    return memoryview(pread_exact(segment.path, segment.offset, segment.length))


class FileStorage:
    """The bytes of one storage: a range of a file."""

    __slots__ = ("path", "offset", "nbytes")

    def __init__(self, path: str, offset: int, nbytes: int):
        self.path, self.offset, self.nbytes = path, offset, nbytes

    @property
    def key(self):
        return (self.path, self.offset)

    def span(self, start: int, length: int) -> Segment:
        return FileSpan(self.path, self.offset + start, length)

    def uints(self, itemsize: int):
        import numpy as np

        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=self.offset, shape=(self.nbytes,)).view(
            _UINT_OF_SIZE[itemsize]
        )


class BufferStorage:
    """The bytes of one storage held in memory (legacy torch.save files are loaded whole)."""

    def __init__(self, buffer):
        self.buffer = memoryview(buffer).cast("B")
        self.nbytes = len(self.buffer)

    @property
    def key(self):
        return id(self.buffer.obj)

    def span(self, start: int, length: int) -> Segment:
        return self.buffer[start : start + length]

    def uints(self, itemsize: int):
        import numpy as np

        return np.frombuffer(self.buffer, dtype=_UINT_OF_SIZE[itemsize])


class StoredTensor(TensorRef):
    """A strided view of a storage, as torch.save records it."""

    __slots__ = ("dtype", "shape", "storage", "storage_offset", "stride")

    def __init__(self, dtype: DType, shape, storage, storage_offset: int = 0, stride=None, shapes=None):
        """`shapes`: a table of shape and stride tuples to share these with (see safe_unpickle)."""
        self.dtype, self.shape = dtype, tuple(int(s) for s in shape)
        self.storage, self.storage_offset = storage, int(storage_offset)
        self.stride = tuple(int(s) for s in stride) if stride is not None else contiguous_strides(self.shape)
        if shapes is not None:
            self.shape = shapes.setdefault(self.shape, self.shape)
            self.stride = shapes.setdefault(self.stride, self.stride)
        if self.numel:
            last = self.storage_offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride))
            if (
                self.storage_offset < 0
                or min(self.stride, default=0) < 0
                or (last + 1) * dtype.itemsize > storage.nbytes
            ):
                raise ConvertError(
                    f"corrupt checkpoint: a {dtype.name} tensor of shape {list(self.shape)} reaches past its storage"
                )

    @property
    def is_contiguous(self) -> bool:
        return all(n == 1 or s == c for n, s, c in zip(self.shape, self.stride, contiguous_strides(self.shape)))

    @property
    def identity(self):
        """Equal for two references to the same elements (tied weights)."""
        return (self.storage.key, self.storage_offset, self.shape, self.stride, self.dtype.name)

    def segments(self, rows: Rows = None) -> Iterator[Segment]:
        length = self.rows_nbytes(rows)
        if not length:
            return
        if self.is_contiguous:
            start = self.storage_offset * self.dtype.itemsize
            if rows is not None:
                start += rows[0] * math.prod(self.shape[1:]) * self.dtype.itemsize
            yield self.storage.span(start, length)
            return
        yield self._gather(rows)

    def _gather(self, rows: Rows) -> memoryview:
        import numpy as np

        itemsize = self.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            self.storage.uints(itemsize)[self.storage_offset :],
            shape=self.shape,
            strides=[s * itemsize for s in self.stride],
            writeable=False,
        )
        if rows is not None:
            view = view[rows[0] : rows[1]]
        return memoryview(np.ascontiguousarray(view).reshape(-1).view(np.uint8))


class ChunkedTensor(TensorRef):
    """A tensor saved as several chunks (a sharded DCP checkpoint), each at its offsets."""

    def __init__(self, dtype: DType, shape, chunks: list[tuple[tuple[int, ...], TensorRef]]):
        self.dtype, self.shape = dtype, tuple(shape)
        self.chunks = sorted(chunks, key=lambda chunk: chunk[0])
        if sum(chunk.numel for _, chunk in self.chunks) != self.numel:
            raise ConvertError(f"corrupt DCP checkpoint: the chunks of a tensor of shape {list(shape)} do not tile it")
        self.row_slabs = all(
            offsets[1:] == (0,) * (len(shape) - 1) and chunk.shape[1:] == self.shape[1:]
            for offsets, chunk in self.chunks
        )

    def segments(self, rows: Rows = None) -> Iterator[Segment]:
        if not self.nbytes:
            return
        if not self.row_slabs:
            yield memoryview(self.array(rows).reshape(-1).view("u1"))
            return
        first, last = rows if rows is not None else (0, self.shape[0] if self.shape else 1)
        for offsets, chunk in self.chunks:
            if not self.shape:
                yield from chunk.segments()
                continue
            start, stop = offsets[0], offsets[0] + chunk.shape[0]
            lo, hi = max(first, start), min(last, stop)
            if lo < hi:
                yield from chunk.segments((lo - start, hi - start))

    def array(self, rows: Rows = None):
        if self.row_slabs:
            return super().array(rows)
        import numpy as np

        full = np.empty(self.shape, dtype=_UINT_OF_SIZE[self.dtype.itemsize])
        for offsets, chunk in self.chunks:
            full[tuple(slice(o, o + n) for o, n in zip(offsets, chunk.shape))] = chunk.array()
        return full if rows is None else full[rows[0] : rows[1]]


class RowSlice(TensorRef):
    """Rows a..b-1 of a tensor: one FSDP2 shard of it."""

    def __init__(self, base: TensorRef, rows: tuple[int, int]):
        self.base, self.rows = base, rows
        self.dtype, self.shape = base.dtype, (rows[1] - rows[0], *base.shape[1:])

    def segments(self, rows: Rows = None) -> Iterator[Segment]:
        start = self.rows[0]
        return self.base.segments(self.rows if rows is None else (start + rows[0], start + rows[1]))
