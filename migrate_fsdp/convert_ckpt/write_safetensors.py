"""Writing safetensors: one file, or Hugging Face shards with a `model.safetensors.index.json`.

The header names each tensor's dtype, shape and byte range; the bytes follow
back to back, so tensors are copied straight from the source. The shard and
index names are those of transformers' save_pretrained.
"""

import json
import os
import struct

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.fileio import OutputFile
from migrate_fsdp.convert_ckpt.tensors import TensorRef

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def check_tensors(model: dict) -> None:
    for key, value in model.items():
        if not isinstance(value, TensorRef):
            raise ConvertError(
                f"safetensors holds only tensors; {key} is a {type(value).__name__} (use --to dcp or torch)"
            )
        if value.dtype.safetensors is None:
            raise ConvertError(f"safetensors has no dtype for {key} ({value.dtype.name}); use --to dcp or torch")


def write_file(path: str, tensors: dict, metadata: dict, on_bytes) -> None:
    header: dict = {"__metadata__": {**metadata, "format": "pt"}}
    offset = 0
    for key, tensor in tensors.items():
        header[key] = {
            "dtype": tensor.dtype.safetensors,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)
    with OutputFile(path, on_bytes) as out:
        out.write(struct.pack("<Q", len(encoded)) + encoded)
        for tensor in tensors.values():
            for segment in tensor.segments():
                out.copy(segment)


def write_sharded(directory: str, tensors: dict, metadata: dict, max_shard_bytes: int, on_bytes) -> None:
    shards: list[dict] = [{}]
    size = 0
    for key, tensor in tensors.items():
        if shards[-1] and size + tensor.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += tensor.nbytes
    if len(shards) == 1:
        write_file(os.path.join(directory, SINGLE_NAME), tensors, metadata, on_bytes)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        write_file(os.path.join(directory, name), shard, metadata, on_bytes)
        weight_map.update(dict.fromkeys(shard, name))
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
    with OutputFile(os.path.join(directory, INDEX_NAME)) as out:
        out.write(json.dumps(index, indent=2, sort_keys=True).encode("utf-8") + b"\n")
