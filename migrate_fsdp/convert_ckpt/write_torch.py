"""Writing torch.save archives: a whole checkpoint (`--to torch`) or one DCP blob.

The records are those torch.save writes (data.pkl, byteorder, data/<key>,
version, .data/serialization_id) except `.format_version`: torch reads that
as leave to compute record offsets from miniz's exact byte layout
(`torch.utils.serialization.config.load.calculate_storage_offsets`); without
it torch reads every offset from the zip directory, which this writer keeps
exact.
"""

import secrets

from migrate_fsdp.convert_ckpt.pickling import dumps
from migrate_fsdp.convert_ckpt.zipfmt import ZipWriter

ARCHIVE = "archive"
FILE_FORMAT_VERSION = b"3\n"


def write_archive(out, obj) -> None:
    """torch.save(obj) into `out` at its current position; tensors are copied from their sources."""
    data, storages = dumps(obj, protocol=2)
    archive = ZipWriter(out)
    archive.add(f"{ARCHIVE}/data.pkl", data)
    archive.add(f"{ARCHIVE}/byteorder", b"little")
    for slot in storages:
        archive.add_segments(f"{ARCHIVE}/data/{slot.key}", slot.tensor.nbytes, slot.tensor.segments())
    archive.add(f"{ARCHIVE}/version", FILE_FORMAT_VERSION)
    archive.add(f"{ARCHIVE}/.data/serialization_id", str(secrets.randbits(128)).zfill(40).encode())
    archive.close()
