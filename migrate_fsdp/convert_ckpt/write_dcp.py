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

import math
import os
from contextlib import ExitStack

from migrate_fsdp.convert_ckpt import dcp_format
from migrate_fsdp.convert_ckpt.fileio import OutputFile
from migrate_fsdp.convert_ckpt.flatten import flatten
from migrate_fsdp.convert_ckpt.pickling import DeferredDict, Pickler
from migrate_fsdp.convert_ckpt.tensors import RowSlice, TensorRef
from migrate_fsdp.convert_ckpt.write_torch import write_archive


def fsdp2_row_chunks(rows: int, shards: int) -> list[tuple[int, int]]:
    """Row ranges of the dim-0 shards FSDP2 gives `shards` ranks (torch.chunk boundaries), empty ones left out."""
    size = math.ceil(rows / shards)
    return [(start, min(rows, start + size)) for start in range(0, rows, size)] if rows else []


def _file_name(rank: int) -> str:
    return f"__{rank}_0.distcp"


# What is kept per flat key until `.metadata` is written, as one tuple (a checkpoint may hold a million tensors):
# (key, dtype, shape, file, start, length) for a tensor stored whole, (key, None, None, file, start, length) for a
# non-tensor value, (key, dtype, shape, chunks) for a tensor stored as chunks (offsets, sizes, file, start, length).


def _chunks(record: tuple) -> tuple:
    if len(record) == 4:
        return record[3]
    _, _, shape, file, start, length = record
    return (((0,) * len(shape), shape, file, start, length),)


def _entries(records: list):
    for record in records:
        key, dtype, shape = record[:3]
        if dtype is None:
            yield key, dcp_format.BYTES_ENTRY
        else:
            yield key, dcp_format.tensor_entry(dtype, shape, [chunk[:2] for chunk in _chunks(record)])


def _storage(records: list):
    for record in records:
        key, dtype = record[:2]
        if dtype is None:
            yield dcp_format.storage_key(key), dcp_format.storage_info(*record[3:])
            continue
        for index, (offsets, _, file, start, length) in enumerate(_chunks(record)):
            yield dcp_format.storage_key(key, offsets, index), dcp_format.storage_info(file, start, length)


def write_dcp(tree: dict, directory: str, checkpoint_id: str, on_bytes, shards: int = 1, sharded=lambda value: False):
    """Write `tree` as DCP into `directory`; `sharded(tensor)` says which tensors FSDP2 shards."""
    files: dict[int, tuple[str, OutputFile]] = {}
    planner_data, records = {}, []
    with ExitStack() as stack:

        def write_blob(rank: int, obj) -> tuple:
            if rank not in files:
                name = _file_name(rank)
                files[rank] = (name, stack.enter_context(OutputFile(os.path.join(directory, name), on_bytes)))
            name, out = files[rank]
            start = out.position
            write_archive(out, obj)
            return name, start, out.position - start

        for key, path, value in flatten(tree):
            planner_data[key] = path
            if not isinstance(value, TensorRef):
                records.append((key, None, None, *write_blob(0, value)))
                continue
            ranges = fsdp2_row_chunks(value.shape[0], shards) if shards > 1 and value.shape and sharded(value) else []
            if len(ranges) > 1:
                chunks = []
                for rank, rows in enumerate(ranges):
                    offsets = (rows[0],) + (0,) * (len(value.shape) - 1)
                    sizes = (rows[1] - rows[0], *value.shape[1:])
                    chunks.append((offsets, sizes, *write_blob(rank, RowSlice(value, rows))))
                records.append((key, value.dtype, value.shape, tuple(chunks)))
            else:
                records.append((key, value.dtype, value.shape, *write_blob(0, value)))
        if not files:  # DCP always has a data file, even for an empty state dict
            stack.enter_context(OutputFile(os.path.join(directory, _file_name(0))))
    with OutputFile(os.path.join(directory, dcp_format.METADATA_FILE)) as metadata_file:  # streamed, not built
        entries, storage = DeferredDict(lambda: _entries(records)), DeferredDict(lambda: _storage(records))
        metadata = dcp_format.metadata(entries, planner_data, storage, checkpoint_id)
        Pickler(metadata_file, protocol=4, memo_globals_only=True).dump(metadata)
