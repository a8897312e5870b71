"""Reading safetensors files and Hugging Face sharded checkpoints (an index plus shard files).

A safetensors file is an 8-byte header length, a JSON header naming each
tensor's dtype, shape and byte range, then the bytes: nothing to unpickle.
"""

import json
import math
import os
import struct

from migrate_fsdp.convert_ckpt.dtypes import BY_SAFETENSORS
from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused
from migrate_fsdp.convert_ckpt.fileio import pread_exact
from migrate_fsdp.convert_ckpt.tensors import FileStorage, StoredTensor

MAX_HEADER = 100 << 20


def read_safetensors(path: str) -> tuple[dict, dict]:
    """(tensors by name in file order, the __metadata__ strings)."""
    size = os.path.getsize(path)
    if size < 8:
        raise ConvertError(f"{path} is truncated (no safetensors header)")
    (header_len,) = struct.unpack("<Q", pread_exact(path, 0, 8))
    if header_len > min(size - 8, MAX_HEADER):
        raise ConvertError(f"{path} is truncated or not safetensors (header of {header_len} bytes)")
    try:
        header = json.loads(pread_exact(path, 8, header_len))
    except ValueError as error:
        raise ConvertError(f"{path}: bad safetensors header: {error}") from None
    if not isinstance(header, dict):
        raise ConvertError(f"{path}: bad safetensors header: not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    for name, info in header.items():
        if not _is_entry(info):
            raise ConvertError(f"{path}: bad safetensors header: {name!r} is not a dtype, shape and data_offsets")
    base = 8 + header_len
    tensors = {}
    for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
        dtype = BY_SAFETENSORS.get(info["dtype"])
        if dtype is None:
            raise Refused(
                f"{path}: tensor {name} has safetensors dtype {info['dtype']}, which convert-ckpt does not convert"
            )
        begin, end = info["data_offsets"]
        if base + end > size:
            raise ConvertError(f"{path} is truncated: tensor {name} ends past the end of the file")
        if end - begin != math.prod(info["shape"]) * dtype.itemsize:
            raise ConvertError(
                f"{path} is corrupt: tensor {name} has bytes {begin}..{end} "
                f"for shape {info['shape']} of {info['dtype']}"
            )
        tensors[name] = StoredTensor(dtype, info["shape"], FileStorage(path, base + begin, end - begin))
    return tensors, metadata


def _is_entry(info) -> bool:
    """A tensor's header entry, checked up front so a malformed header is reported as such, not as a crash."""

    def naturals(value, length=None):
        return (
            isinstance(value, list)
            and (length is None or len(value) == length)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value)
        )

    return (
        isinstance(info, dict)
        and isinstance(info.get("dtype"), str)
        and naturals(info.get("shape"))
        and naturals(info.get("data_offsets"), 2)
    )


def read_safetensors_index(index_path: str) -> tuple[dict, dict]:
    with open(index_path, encoding="utf-8") as file:
        try:
            weight_map = json.load(file)["weight_map"]
        except (ValueError, KeyError, TypeError):
            raise ConvertError(f"{index_path} is not a safetensors index (no weight_map)") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ConvertError(f"{index_path}: its weight_map does not map tensor names to shard files")
    directory = os.path.dirname(index_path)
    tensors, metadata = {}, {}
    for shard in dict.fromkeys(weight_map.values()):
        if os.path.isabs(shard) or ".." in shard.replace("\\", "/").split("/"):
            raise ConvertError(f"{index_path} names a shard outside its directory ({shard})")
        shard_path = os.path.join(directory, shard)
        if not os.path.isfile(shard_path):
            raise ConvertError(f"incomplete checkpoint: {shard} named by {os.path.basename(index_path)} is missing")
        shard_tensors, shard_metadata = read_safetensors(shard_path)
        tensors.update(shard_tensors)
        metadata.update(shard_metadata)
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ConvertError(
            f"incomplete checkpoint: {len(missing)} tensors of the index are in no shard, e.g. {missing[0]}"
        )
    return tensors, metadata
