"""Reading a DCP checkpoint directory (the reverse direction) without torch.distributed.checkpoint.

Each tensor chunk and each non-tensor value is a torch.save blob at an offset
of a .distcp file; the tree is rebuilt from the metadata's planner_data, the
way dcp_to_torch_save does.
"""

import os

from migrate_fsdp.convert_ckpt.dcp_format import METADATA_FILE, METADATA_GLOBALS, is_bytes_entry
from migrate_fsdp.convert_ckpt.dtypes import BY_NAME
from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused
from migrate_fsdp.convert_ckpt.fileio import pread_exact
from migrate_fsdp.convert_ckpt.flatten import set_element
from migrate_fsdp.convert_ckpt.read_torch import read_archive
from migrate_fsdp.convert_ckpt.safe_unpickle import unpickle
from migrate_fsdp.convert_ckpt.tensors import ChunkedTensor, StoredTensor


def read_metadata(directory: str):
    path = os.path.join(directory, METADATA_FILE)
    data = pread_exact(path, 0, os.path.getsize(path))
    metadata = unpickle(data, None, path, extra_globals=METADATA_GLOBALS)
    if type(metadata).__name__ != "Metadata" or not isinstance(getattr(metadata, "state_dict_metadata", None), dict):
        raise ConvertError(f"{path} is not DCP metadata")
    return metadata


def read_dcp(directory: str, allow_unsafe: bool = False) -> dict:
    metadata = read_metadata(directory)
    storage = {}
    for index, info in (metadata.storage_data or {}).items():
        offsets = tuple(index.offset) if index.offset is not None else None
        storage[(index.fqn, offsets)] = info
    planner_data = metadata.planner_data or {}
    tree: dict = {}
    for fqn, entry in metadata.state_dict_metadata.items():
        if is_bytes_entry(entry):
            value = _read_blob(directory, storage, fqn, None, allow_unsafe)
        else:
            value = _read_tensor(directory, storage, fqn, entry, allow_unsafe)
        path = tuple(planner_data.get(fqn, (fqn,)))
        set_element(tree, path, value)
    return tree


def _read_tensor(directory, storage, fqn, entry, allow_unsafe):
    dtype = BY_NAME.get(getattr(entry.properties.dtype, "name", None))
    if dtype is None:
        raise Refused(f"{fqn} has dtype {entry.properties.dtype!r}, which convert-ckpt does not convert")
    size = tuple(entry.size)
    chunks = []
    for chunk in entry.chunks:
        offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
        tensor = _read_blob(directory, storage, fqn, offsets, allow_unsafe)
        if not isinstance(tensor, StoredTensor) or tensor.shape != sizes or tensor.dtype != dtype:
            raise ConvertError(f"corrupt DCP checkpoint: chunk {list(offsets)} of {fqn} does not match its metadata")
        chunks.append((offsets, tensor))
    if len(chunks) == 1 and chunks[0][1].shape == size:
        return chunks[0][1]
    return ChunkedTensor(dtype, size, chunks)


def _read_blob(directory, storage, fqn, offsets, allow_unsafe):
    info = storage.get((fqn, offsets))
    if info is None:
        raise ConvertError(f"corrupt DCP checkpoint: no storage entry for {fqn} at {list(offsets or ())}")
    if info.transform_descriptors:
        raise Refused(f"{fqn} is stored with transforms {info.transform_descriptors}, which convert-ckpt does not read")
    relative = info.relative_path
    if os.path.isabs(relative) or ".." in relative.replace("\\", "/").split("/"):
        raise ConvertError(f"corrupt DCP checkpoint: {fqn} points outside the directory ({relative})")
    path = os.path.join(directory, relative)
    if not os.path.isfile(path):
        raise ConvertError(f"incomplete DCP checkpoint: {relative} is missing")
    return read_archive(path, info.offset, info.offset + info.length, f"{path} ({fqn})", allow_unsafe)
