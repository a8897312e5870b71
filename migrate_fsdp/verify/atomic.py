"""Write-then-rename, so a report or plot is either complete or not there."""

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path):
    """Yield a temporary path beside `path`; it replaces `path` only if the block succeeds.

    The file ends with the mode any new file of the user's gets (0666 less the
    umask), not mkstemp's private 0600.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_writable(directory) -> None:
    """Create and remove a scratch file in `directory` (OSError if that fails).

    A report, plot or log place that cannot be written is then refused before
    minutes of training, not after them.
    """
    fd, tmp = tempfile.mkstemp(prefix=".migrate-fsdp-verify-", dir=directory)
    os.close(fd)
    os.unlink(tmp)
