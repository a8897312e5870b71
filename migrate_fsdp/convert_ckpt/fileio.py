"""Moving bytes: file spans are copied with copy_file_range (no trip through user space), buffers written.

Reading a multi-GB checkpoint through Python objects would cost memory and a
copy per byte; the kernel copies page cache to page cache instead, which is
what `cp` does. Where copy_file_range is missing or refused (another
filesystem on an old kernel, non-Linux), a bounded pread/write loop stands in.
"""

import errno
import os
from collections.abc import Callable, Iterable

from migrate_fsdp.convert_ckpt.tensors import FileSpan, Segment

COPY_STEP = 256 << 20  # bytes per copy_file_range call: large enough for readahead, small enough for progress
_FALLBACK_ERRNOS = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM, errno.ETXTBSY}

_source_fds: dict[str, int] = {}


def source_fd(path: str) -> int:
    fd = _source_fds.get(path)
    if fd is None:
        fd = os.open(path, os.O_RDONLY)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        _source_fds[path] = fd
    return fd


def close_sources() -> None:
    while _source_fds:
        os.close(_source_fds.popitem()[1])


def pread_exact(path: str, offset: int, length: int) -> bytes:
    fd = source_fd(path)
    chunks, done = [], 0
    while done < length:
        chunk = os.pread(fd, min(length - done, COPY_STEP), offset + done)
        if not chunk:
            raise EOFError(f"{path} ends at byte {offset + done}, {length - done} bytes short")
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def iter_blocks(segments: Iterable[Segment], block: int) -> Iterable[memoryview]:
    """The bytes of `segments` in pieces of at most `block` bytes, for streaming comparisons."""
    for segment in segments:
        if isinstance(segment, memoryview):
            for start in range(0, len(segment), block):
                yield segment[start : start + block]
            continue
        for start in range(0, segment.length, block):
            yield memoryview(pread_exact(segment.path, segment.offset + start, min(block, segment.length - start)))


class OutputFile:
    """A file written front to back, created exclusively, fsync'ed on close."""

    _kernel_copy = hasattr(os, "copy_file_range")

    def __init__(self, path, on_bytes: Callable[[int], None] = lambda n: None):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.position = 0
        self.on_bytes = on_bytes

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
            self.position += written

    def copy(self, segment: Segment) -> None:
        if isinstance(segment, memoryview):
            for start in range(0, len(segment), COPY_STEP):
                piece = segment[start : start + COPY_STEP]
                self.write(piece)
                self.on_bytes(len(piece))
            return
        self._copy_span(segment)

    def _copy_span(self, span: FileSpan) -> None:
        src = source_fd(span.path)
        done = 0
        while done < span.length:
            step = min(COPY_STEP, span.length - done)
            copied = self._copy_step(src, span.offset + done, step)
            if copied == 0:
                raise EOFError(f"{span.path} ends at byte {span.offset + done}, {span.length - done} bytes short")
            done += copied
            self.on_bytes(copied)

    def _copy_step(self, src: int, offset: int, step: int) -> int:
        if OutputFile._kernel_copy:
            try:
                copied = os.copy_file_range(src, self.fd, step, offset)
                self.position += copied
                return copied
            except OSError as error:
                if error.errno not in _FALLBACK_ERRNOS:
                    raise
                OutputFile._kernel_copy = False
        data = os.pread(src, min(step, 16 << 20), offset)
        self.write(data)
        return len(data)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        self.close(sync=kind is None)  # no fsync for a file about to be thrown away

    def close(self, sync: bool = True) -> None:
        try:
            if sync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
