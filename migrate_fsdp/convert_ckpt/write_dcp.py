"""Writing a DCP checkpoint directory as FileSystemWriter lays it out, one tensor at a time.

Why not dcp.save: it needs every tensor materialised as a torch.Tensor, its
planner pickles metadata for all of them first, its single-process writer
serialises each tensor through torch.save (CRC over every byte) and it costs
`import torch.distributed.checkpoint` (seconds, ~50 MB). The format itself is
simple: per flat key a torch.save blob (of the tensor, or of the pickled
value) at an offset of a `__<rank>_<n>.distcp` file, and a `.metadata` pickle
mapping keys to blobs.

`shards=N` stores each model and optimizer tensor as the N dim-0 chunks FSDP2
gives its ranks (torch.chunk: ceil(rows/N) rows each, empty chunks dropped),
chunk r in `__r_0.distcp`, the layout dcp.save produces from N FSDP2 ranks: a
rank's load then reads its own chunk only.
"""

import functools
import math
import os
from array import array
from contextlib import ExitStack

from migrate_fsdp.convert_ckpt import dcp_format
from migrate_fsdp.convert_ckpt.fileio import OutputFile
from migrate_fsdp.convert_ckpt.flatten import flatten
from migrate_fsdp.convert_ckpt.pickling import DeferredDict, Fragment, Pickler
from migrate_fsdp.convert_ckpt.tensors import RowSlice, TensorRef
from migrate_fsdp.convert_ckpt.write_torch import write_archive


def fsdp2_row_chunks(rows: int, shards: int) -> list[tuple[int, int]]:
    """Row ranges of the dim-0 shards FSDP2 gives `shards` ranks (torch.chunk boundaries), empty ones left out."""
    size = math.ceil(rows / shards)
    return [(start, min(rows, start + size)) for start in range(0, rows, size)] if rows else []


def _file_name(rank: int) -> str:
    return f"__{rank}_0.distcp"


def _placements(value, shards: int, sharded) -> list[tuple]:
    """(rank, chunk offsets, chunk sizes, rows) of each blob holding `value`: a non-tensor is one blob on rank 0
    (offsets and sizes None), so is a tensor stored whole (rows None); a sharded tensor is one blob per FSDP2 row
    chunk, chunk r on rank r."""
    if not isinstance(value, TensorRef):
        return [(0, None, None, None)]
    shape = value.shape
    ranges = fsdp2_row_chunks(shape[0], shards) if shards > 1 and shape and sharded(value) else []
    if len(ranges) <= 1:
        return [(0, (0,) * len(shape), shape, None)]
    rest = shape[1:]
    return [(rank, (a, *(0,) * len(rest)), (b - a, *rest), (a, b)) for rank, (a, b) in enumerate(ranges)]


class _Blobs:
    """Where each blob went, in the order written: its start and length in its rank's file as machine integers, since a
    million tensors must not leave a million Python objects behind them. `.metadata` walks the tree again and
    recomputes each key's placements, which the tree and the options determine."""

    def __init__(self):
        self.starts, self.lengths = array("Q"), array("Q")

    def add(self, start: int, length: int) -> None:
        self.starts.append(start)
        self.lengths.append(length)

    def placed(self, tree, shards: int, sharded):
        """(key, path, value, [(offsets, sizes, file, start, length) per blob]) for every flat key, in order."""
        index = 0
        for key, path, value in flatten(tree, unique=False):
            blobs = []
            for rank, offsets, sizes, _ in _placements(value, shards, sharded):
                blobs.append((offsets, sizes, _file_name(rank), self.starts[index], self.lengths[index]))
                index += 1
            yield key, path, value, blobs


def _entries(placed):
    for key, _, value, blobs in placed:
        if not isinstance(value, TensorRef):
            yield key, dcp_format.BYTES_ENTRY
        else:
            chunks = [blob[:2] for blob in blobs]
            build = functools.partial(dcp_format.tensor_entry, value.dtype, value.shape, chunks)
            yield key, Fragment((value.dtype.name, value.shape, tuple(chunks)), build)


def _storage(placed):
    for key, _, value, blobs in placed:
        if not isinstance(value, TensorRef):
            yield dcp_format.storage_key(key), dcp_format.storage_info(*blobs[0][2:])
            continue
        for index, (offsets, _, file, start, length) in enumerate(blobs):
            yield dcp_format.storage_key(key, offsets, index), dcp_format.storage_info(file, start, length)


def write_dcp(tree: dict, directory: str, checkpoint_id: str, on_bytes, shards: int = 1, sharded=lambda value: False):
    """Write `tree` as DCP into `directory`; `sharded(tensor)` says which tensors FSDP2 shards."""
    files: dict[int, OutputFile] = {}
    blobs = _Blobs()
    with ExitStack() as stack:
        for _, _, value in flatten(tree):
            for rank, _, _, rows in _placements(value, shards, sharded):
                if rank not in files:
                    path = os.path.join(directory, _file_name(rank))
                    files[rank] = stack.enter_context(OutputFile(path, on_bytes))
                out = files[rank]
                start = out.position
                write_archive(out, value if rows is None else RowSlice(value, rows))
                blobs.add(start, out.position - start)
        if not files:  # DCP always has a data file, even for an empty state dict
            stack.enter_context(OutputFile(os.path.join(directory, _file_name(0))))
    with OutputFile(os.path.join(directory, dcp_format.METADATA_FILE)) as metadata_file:  # streamed, not built
        metadata = dcp_format.metadata(
            DeferredDict(lambda: _entries(blobs.placed(tree, shards, sharded))),
            DeferredDict(lambda: ((key, path) for key, path, _, _ in blobs.placed(tree, shards, sharded))),
            DeferredDict(lambda: _storage(blobs.placed(tree, shards, sharded))),
            checkpoint_id,
        )
        Pickler(metadata_file, protocol=4, memo_globals_only=True).dump(metadata)
