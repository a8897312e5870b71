"""Reading torch.save files: the zip format by byte offsets, legacy (pre-1.6) files through torch.load.

A zip checkpoint is read without torch: the restricted unpickler turns
data.pkl into containers whose tensors point at their records' bytes. The same
reader parses each torch.save blob inside a DCP .distcp file.
"""

import os
import re

from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused, UnsafePickle
from migrate_fsdp.convert_ckpt.fileio import pread_exact
from migrate_fsdp.convert_ckpt.safe_unpickle import NUMPY_ALLOWED, STDLIB_ALLOWED, import_global, unpickle
from migrate_fsdp.convert_ckpt.tensors import BufferStorage, FileStorage, StoredTensor
from migrate_fsdp.convert_ckpt.zipfmt import read_records


def read_archive(path: str, start: int, end: int, what: str, allow_unsafe: bool = False):
    """The object torch.save wrote into bytes start..end of `path`, tensors left on disk."""

    def pread(offset, length):
        try:
            return pread_exact(path, offset, length)
        except EOFError:
            raise ConvertError(f"{what} is truncated") from None

    records = read_records(pread, start, end, what)
    pickles = sorted((name for name in records if name.endswith("data.pkl")), key=len)
    if not pickles:
        raise ConvertError(f"{what} is a zip file but not a torch.save checkpoint (no data.pkl)")
    prefix = pickles[0][: -len("data.pkl")]
    byteorder = records.get(prefix + "byteorder")
    if byteorder is not None and pread(byteorder.offset, byteorder.size) != b"little":
        raise Refused(f"{what} was saved on a big-endian machine; load and re-save it on a little-endian one")

    def storage(key, dtype):
        record = records.get(f"{prefix}data/{key}")
        if record is None:
            raise ConvertError(f"{what} is corrupt: storage {key} is missing")
        return FileStorage(path, record.offset, record.size)

    data = records[pickles[0]]
    return unpickle(pread(data.offset, data.size), storage, what, allow_unsafe)


def read_torch_zip(path: str, allow_unsafe: bool = False):
    return read_archive(path, 0, os.path.getsize(path), path, allow_unsafe)


def read_torch_legacy(path: str, allow_unsafe: bool = False):
    """A pre-1.6 torch.save file, loaded whole by torch (its layout has no index to read from)."""
    import pickle

    import torch

    allowed = [import_global(module, name) for module, names in STDLIB_ALLOWED.items() for name in names]
    for dotted in NUMPY_ALLOWED:
        try:
            allowed.append(import_global(*dotted.rsplit(".", 1)))
        except (ImportError, AttributeError):
            pass
    try:
        with torch.serialization.safe_globals(allowed):
            loaded = torch.load(path, map_location="cpu", weights_only=not allow_unsafe)
    except pickle.UnpicklingError as error:
        message = str(error)
        if "ShardedTensor" in message:
            raise Refused(
                f"{path} holds ShardedTensor values (an FSDP1 SHARDED_STATE_DICT): save it with dcp.save"
            ) from None
        unsafe = re.findall(r"GLOBAL ([\w.]+)", message)
        if unsafe:
            raise UnsafePickle(unsafe) from None
        raise ConvertError(f"{path}: {message.splitlines()[0]}") from None
    except (RuntimeError, EOFError) as error:
        raise ConvertError(f"{path} is truncated or corrupt: {str(error).splitlines()[0]}") from None
    return _from_torch(loaded, torch)


def _from_torch(value, torch):
    """Real torch tensors (from torch.load) as in-memory tensor references, containers kept."""
    from migrate_fsdp.convert_ckpt.dtypes import BY_NAME

    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise Refused("the checkpoint holds sparse or quantized tensors, which convert-ckpt does not convert")
        dtype = BY_NAME[str(value.dtype).removeprefix("torch.")]
        flat = value.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        return StoredTensor(dtype, tuple(value.shape), BufferStorage(flat))
    if isinstance(value, dict):
        converted = type(value)() if type(value) is not dict else {}
        for key, item in value.items():
            converted[key] = _from_torch(item, torch)
        return converted
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_from_torch(item, torch) for item in value)
    return value
