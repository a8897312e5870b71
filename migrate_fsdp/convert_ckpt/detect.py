"""Which format SRC is, told from its content (file names lie: a `.pt` may be anything), and reading it."""

import glob
import os
import struct
from dataclasses import dataclass, field

from migrate_fsdp.convert_ckpt.dcp_format import METADATA_FILE
from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused

TORCH_ZIP, TORCH_LEGACY, SAFETENSORS, SAFETENSORS_INDEX, DCP = (
    "torch",
    "torch-legacy",
    "safetensors",
    "safetensors-index",
    "dcp",
)
# torch.save's legacy format opens with a pickled magic number (0x1950a86a20f9469cfc6c, protocol 2, LONG1)
_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"


@dataclass
class Source:
    path: str
    kind: str
    tree: dict
    safetensors_metadata: dict = field(default_factory=dict)


def detect(path: str) -> tuple[str, str]:
    """(kind, the file or directory to read)."""
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, METADATA_FILE)):
            return DCP, path
        indexes = glob.glob(os.path.join(glob.escape(path), "*.safetensors.index.json"))
        if len(indexes) == 1:
            return SAFETENSORS_INDEX, indexes[0]
        singles = glob.glob(os.path.join(glob.escape(path), "*.safetensors"))
        if not indexes and len(singles) == 1:
            return SAFETENSORS, singles[0]
        raise ConvertError(
            f"{path} is a directory but neither a DCP checkpoint ({METADATA_FILE}) nor a safetensors checkpoint "
            "(one *.safetensors.index.json, or one *.safetensors file)"
        )
    if not os.path.exists(path):
        raise ConvertError(f"{path} does not exist")
    size = os.path.getsize(path)
    if size == 0:
        raise Refused(f"{path} is empty (0 bytes): the save did not complete; use the file written by rank 0")
    with open(path, "rb") as file:
        head = file.read(16)
    if head.startswith(b"PK\x03\x04"):
        return TORCH_ZIP, path
    if head.startswith(_LEGACY_MAGIC):
        return TORCH_LEGACY, path
    if len(head) >= 9 and struct.unpack("<Q", head[:8])[0] < size and head[8:9] == b"{":
        return SAFETENSORS, path
    if path.endswith(".json") and head.lstrip().startswith(b"{"):
        return SAFETENSORS_INDEX, path
    if head[:1] == b"\x80":
        raise Refused(f"{path} is a plain pickle, not a torch.save checkpoint; load it and save it with torch.save")
    raise ConvertError(
        f"{path} is not a checkpoint convert-ckpt reads (torch.save file, safetensors file or index, DCP directory)"
    )


def read_source(path: str, allow_unsafe: bool) -> Source:
    kind, target = detect(path)
    if kind == TORCH_ZIP:
        from migrate_fsdp.convert_ckpt.read_torch import read_torch_zip

        return Source(path, kind, read_torch_zip(target, allow_unsafe))
    if kind == TORCH_LEGACY:
        from migrate_fsdp.convert_ckpt.read_torch import read_torch_legacy

        return Source(path, kind, read_torch_legacy(target, allow_unsafe))
    if kind == DCP:
        from migrate_fsdp.convert_ckpt.read_dcp import read_dcp

        return Source(path, kind, read_dcp(target, allow_unsafe))
    from migrate_fsdp.convert_ckpt.read_safetensors import read_safetensors, read_safetensors_index

    tensors, metadata = (read_safetensors if kind == SAFETENSORS else read_safetensors_index)(target)
    return Source(path, kind, tensors, metadata)
