"""The zip container of torch.save, read and written as byte offsets.

torch.save writes an uncompressed zip whose records are aligned to 64 bytes;
tensor data lies in it verbatim, so a record is just a byte range. Python's
zipfile would check CRCs (torch may write none) and cannot read a zip that sits
in the middle of a DCP .distcp file, hence this small reader. The writer
mirrors torch's layout (alignment padding in an "FB" extra field, zip64 end
records) and, like `torch.serialization.config.save.compute_crc32 = False`,
leaves the CRC of tensor records at 0: torch does not check them.
"""

import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from migrate_fsdp.convert_ckpt.errors import ConvertError

ALIGNMENT = 64
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_ZIP64_EOCD = struct.Struct("<IQHHIIQQQQ")
_U32 = 0xFFFFFFFF  # a 32-bit field holding this means "see the zip64 extra field"
ZIP64_LIMIT = _U32  # sizes and offsets from here on need zip64 fields


@dataclass(frozen=True, slots=True)  # one per tensor: no per-instance dict
class Record:
    name: str
    offset: int  # absolute offset of the record's data in the file
    size: int


def read_records(pread: Callable[[int, int], bytes], start: int, end: int, what: str) -> dict[str, Record]:
    """The records of the zip stored in bytes start..end of a file, by name."""
    for window in (1024, (1 << 16) + _EOCD.size):  # the end record is last; only a zip comment pushes it back
        tail_start = max(start, end - window)
        tail = pread(tail_start, end - tail_start)
        at = tail.rfind(b"PK\x05\x06")
        if at >= 0 and end - (tail_start + at) >= _EOCD.size:
            break
    else:
        raise ConvertError(
            f"{what} is truncated or not a complete zip (no end-of-archive record); re-copy or re-save it"
        )
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    locator_at = at - _ZIP64_LOCATOR.size
    if locator_at >= 0 and tail[locator_at : locator_at + 4] == b"PK\x06\x07":
        _, _, eocd64_offset, _ = _ZIP64_LOCATOR.unpack_from(tail, locator_at)
        eocd64 = pread(start + eocd64_offset, _ZIP64_EOCD.size)
        if eocd64[:4] != b"PK\x06\x06":
            raise ConvertError(f"{what} is corrupt: bad zip64 end record")
        *_, count, cd_size, cd_offset = _ZIP64_EOCD.unpack(eocd64)
    if start + cd_offset + cd_size > end:
        raise ConvertError(f"{what} is truncated: its zip directory points past the end of the data")
    directory = pread(start + cd_offset, cd_size)
    records, pos = {}, 0
    for _ in range(count):
        if directory[pos : pos + 4] != b"PK\x01\x02":
            raise ConvertError(f"{what} is corrupt: bad zip directory entry")
        fields = _CENTRAL.unpack_from(directory, pos)
        method, size, name_len, extra_len, comment_len, header_offset = (
            fields[4],
            fields[9],
            fields[10],
            fields[11],
            fields[12],
            fields[16],
        )
        name = directory[pos + _CENTRAL.size : pos + _CENTRAL.size + name_len].decode("utf-8")
        extra = directory[pos + _CENTRAL.size + name_len : pos + _CENTRAL.size + name_len + extra_len]
        size, header_offset = _apply_zip64(extra, size, fields[8], header_offset)
        pos += _CENTRAL.size + name_len + extra_len + comment_len
        if method != 0:
            raise ConvertError(
                f"{what}: record {name} is compressed; torch.save never compresses, this is not its file"
            )
        local = pread(start + header_offset, _LOCAL.size)
        if local[:4] != b"PK\x03\x04":
            raise ConvertError(f"{what} is corrupt: bad local header for {name}")
        *_, local_name_len, local_extra_len = _LOCAL.unpack(local)
        data = start + header_offset + _LOCAL.size + local_name_len + local_extra_len
        if data + size > end:
            raise ConvertError(f"{what} is truncated: record {name} ends past the end of the data")
        records[name] = Record(name, data, size)
    return records


def _apply_zip64(extra: bytes, size: int, compressed: int, offset: int) -> tuple[int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            values = iter(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            if size == _U32:
                size = next(values)
            if compressed == _U32:
                next(values)
            if offset == _U32:
                offset = next(values)
        pos += 4 + length
    return size, offset


class ZipWriter:
    """Writes one zip as a run of bytes starting at `out.position` (offsets are relative to that start)."""

    def __init__(self, out):
        self.out = out
        self.base = out.position
        self.entries: list[tuple[bytes, int, int, int]] = []  # name, crc, size, header offset

    def add(self, name: str, data: bytes) -> None:
        self._header(name, len(data), zlib.crc32(data))
        self.out.write(data)

    def add_segments(self, name: str, size: int, segments: Iterable) -> None:
        self._header(name, size, 0)
        before = self.out.position
        for segment in segments:
            self.out.copy(segment)
        if self.out.position - before != size:
            raise ConvertError(f"internal error: record {name} has {self.out.position - before} bytes, expected {size}")

    def _header(self, name: str, size: int, crc: int) -> None:
        encoded = name.encode("utf-8")
        offset = self.out.position - self.base
        zip64 = size >= ZIP64_LIMIT
        extra = struct.pack("<HHQQ", 1, 16, size, size) if zip64 else b""
        unpadded = offset + _LOCAL.size + len(encoded) + len(extra) + 4
        padding = -unpadded % ALIGNMENT
        extra += struct.pack("<HH", 0x4246, padding) + b"Z" * padding  # "FB", as torch pads
        stored = _U32 if zip64 else size
        self.out.write(
            _LOCAL.pack(0x04034B50, 45 if zip64 else 20, 0, 0, 0, 0x21, crc, stored, stored, len(encoded), len(extra))
            + encoded
            + extra
        )
        self.entries.append((encoded, crc, size, offset))

    def close(self) -> None:
        cd_start = self.out.position - self.base
        for encoded, crc, size, offset in self.entries:
            big = [value for value in (size, size, offset) if value >= ZIP64_LIMIT]
            extra = struct.pack(f"<HH{len(big)}Q", 1, 8 * len(big), *big) if big else b""
            stored_size = _U32 if size >= ZIP64_LIMIT else size
            stored_offset = _U32 if offset >= ZIP64_LIMIT else offset
            self.out.write(
                _CENTRAL.pack(
                    0x02014B50,
                    45,
                    45 if big else 20,
                    0,
                    0,
                    0,
                    0x21,
                    crc,
                    stored_size,
                    stored_size,
                    len(encoded),
                    len(extra),
                    0,
                    0,
                    0,
                    0,
                    stored_offset,
                )
                + encoded
                + extra
            )
        cd_size = self.out.position - self.base - cd_start
        eocd64_offset = self.out.position - self.base
        count = len(self.entries)
        self.out.write(
            _ZIP64_EOCD.pack(0x06064B50, 44, 45, 45, 0, 0, count, count, cd_size, cd_start)
            + _ZIP64_LOCATOR.pack(0x07064B50, 0, eocd64_offset, 1)
            + _EOCD.pack(
                0x06054B50,
                0,
                0,
                min(count, 0xFFFF),
                min(count, 0xFFFF),
                _U32 if cd_size >= ZIP64_LIMIT else cd_size,
                _U32 if cd_start >= ZIP64_LIMIT else cd_start,
                0,
            )
        )
