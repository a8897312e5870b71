"""Writing torch.save archives: a whole checkpoint (`--to torch`) or one DCP blob.

The records are those torch.save writes (data.pkl, byteorder, data/<key>,
version, .data/serialization_id) except `.format_version`: torch reads that
as leave to compute record offsets from miniz's exact byte layout
(`torch.utils.serialization.config.load.calculate_storage_offsets`); without
it torch reads every offset from the zip directory, which this writer keeps
exact.
"""

import functools
import secrets

from migrate_fsdp.convert_ckpt.dtypes import DType
from migrate_fsdp.convert_ckpt.pickling import StorageSlot, dumps
from migrate_fsdp.convert_ckpt.tensors import TensorRef
from migrate_fsdp.convert_ckpt.zipfmt import ZipWriter

ARCHIVE = "archive"
FILE_FORMAT_VERSION = b"3\n"


def write_archive(out, obj) -> None:
    """torch.save(obj) into `out` at its current position; tensors are copied from their sources."""
    if isinstance(obj, TensorRef):  # a DCP blob: pickled once per dtype and shape, not once per tensor
        data, storages = _lone_tensor_pickle(obj.dtype, obj.shape), [StorageSlot("0", obj)]
    else:
        data, storages = dumps(obj, protocol=2)
    archive = ZipWriter(out)
    archive.add(f"{ARCHIVE}/data.pkl", data)
    archive.add(f"{ARCHIVE}/byteorder", b"little")
    for slot in storages:
        archive.add_segments(f"{ARCHIVE}/data/{slot.key}", slot.tensor.nbytes, slot.tensor.segments())
    archive.add(f"{ARCHIVE}/version", FILE_FORMAT_VERSION)
    archive.add(f"{ARCHIVE}/.data/serialization_id", str(secrets.randbits(128)).zfill(40).encode())
    archive.close()


class _Shape(TensorRef):
    """A tensor of which only the dtype and shape are known: all its pickle depends on."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: DType, shape: tuple):
        self.dtype, self.shape = dtype, shape


@functools.lru_cache(maxsize=1024)
def _lone_tensor_pickle(dtype: DType, shape: tuple) -> bytes:
    """The data.pkl of torch.save(tensor): the same for all tensors of one dtype and shape (storage "0", contiguous
    strides)."""
    data, _ = dumps(_Shape(dtype, shape), protocol=2)
    return data
