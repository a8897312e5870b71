"""Reading torch.save files: the zip format by byte offsets, legacy (pre-1.6) files through torch.load.

A zip checkpoint is read without torch: the restricted unpickler turns
data.pkl into containers whose tensors point at their records' bytes. The same
reader parses each torch.save blob inside a DCP .distcp file.
"""

import os
import pickletools

from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused
from migrate_fsdp.convert_ckpt.fileio import pread_exact
from migrate_fsdp.convert_ckpt.safe_unpickle import NUMPY_ALLOWED, STDLIB_ALLOWED, import_global, unpickle, vet_pickle
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
    """A pre-1.6 torch.save file, loaded whole by torch (its layout has no index to read from).

    Its checkpoint pickle is scanned first, as a zip file's data.pkl is, so both formats get the same
    allow-list, the same refusals and the same errors; torch's weights_only loader then runs it.
    """
    import pickle

    import torch

    vet_pickle(_legacy_pickle(path), path, allow_unsafe)
    try:
        with torch.serialization.safe_globals(_torch_safe_globals()):
            loaded = torch.load(path, map_location="cpu", weights_only=not allow_unsafe)
    except pickle.UnpicklingError as error:
        raise ConvertError(f"{path}: torch.load refused it: {_reason(str(error))}") from None
    except (RuntimeError, EOFError, ValueError) as error:  # how torch fails on a cut-off legacy file
        raise ConvertError(f"{path} is truncated or corrupt: {_reason(str(error)) or type(error).__name__}") from None
    return _from_torch(loaded, torch)


def _legacy_pickle(path: str) -> bytes:
    """The checkpoint's pickle: the fourth of a legacy file's pickles, after its magic number, protocol version
    and system info; read opcode by opcode, nothing unpickled."""
    with open(path, "rb") as file:
        for _ in range(4):
            start = file.tell()
            try:
                for opcode, _, _ in pickletools.genops(file):
                    if opcode.name == "STOP":
                        break
            except ValueError as error:
                raise ConvertError(f"{path} is truncated or corrupt: {error}") from None
        end = file.tell()
        file.seek(start)
        return file.read(end - start)


def _torch_safe_globals() -> list:
    """The allow-list for torch's weights_only loader, numpy's functions under both the names numpy 1 and 2
    pickles give them (torch matches a global by name)."""
    allowed: list = [import_global(module, name) for module, names in STDLIB_ALLOWED.items() for name in names]
    try:
        import numpy
    except ImportError:
        return allowed
    for dotted in NUMPY_ALLOWED:
        allowed.append((import_global(*dotted.rsplit(".", 1)), dotted))
    return allowed + [getattr(numpy.dtypes, name) for name in dir(numpy.dtypes) if name.endswith("DType")]


def _reason(message: str) -> str:
    """The line of torch's multi-line load error that says what went wrong."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            detail = line.split("WeightsUnpickler error:", 1)[1].strip()
            return detail or (lines[index + 1] if index + 1 < len(lines) else line)
    return lines[0] if lines else ""


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
