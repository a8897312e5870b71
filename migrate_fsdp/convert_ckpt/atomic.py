"""All or nothing: the output is built beside DST under a temporary name and renamed into place at the end.

A rename within one directory is atomic, so DST is either absent (or the old
one, with --force) or complete; Ctrl-C, SIGTERM or any error removes the
temporary output instead. Replacing an existing DST takes two renames (old
aside, new in place); Ctrl-C and SIGTERM are held back between them, so an
interruption can never leave DST missing. Only SIGKILL (or power loss) can
leave a temporary behind; its name carries the PID, and the next run writing
beside it removes it once that process is gone.
"""

import errno
import os
import re
import secrets
import shutil
import signal
import sys
import threading
from contextlib import contextmanager

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.fileio import fsync_dir
from migrate_fsdp.stale import remove_stale

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def check_destination(dst: str, force: bool) -> None:
    if os.path.lexists(dst) and not force:
        raise ConvertError(f"{dst} exists; pass --force to replace it")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise ConvertError(f"cannot write {dst}: directory {parent} does not exist")


# A write error without a file name (os.write says no more than "No space left on device") is about the output.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EROFS}


def remove_stale_temporaries(dst: str, err=None) -> None:
    """`.DST.tmp-PID-*` (and, once DST is back in place, `.DST.old-PID-*`) of processes that were killed."""
    parent, name = os.path.split(os.path.abspath(dst))
    kinds = "tmp|old" if os.path.lexists(dst) else "tmp"  # without DST an .old- is the only copy of the old DST
    for path in remove_stale(parent, re.compile(rf"\.{re.escape(name)}\.(?:{kinds})-(?P<pid>\d+)-[0-9a-f]+")):
        (err or sys.stderr).write(f"migrate-fsdp convert-ckpt: removed {path}, left by a killed run\n")


def _naming_dst(error: OSError, temporary: str, dst: str) -> ConvertError | None:
    """The error of a write into the temporary output, reworded to name DST (the path the user gave)."""
    where = error.filename if isinstance(error.filename, str) else None
    if where is not None and (where == temporary or where.startswith(temporary + os.sep)):
        return ConvertError(f"cannot write {dst + where[len(temporary):]}: {error.strerror or error}")
    if where is None and error.errno in _WRITE_ERRNOS:
        return ConvertError(f"cannot write {dst}: {error.strerror or error}")
    return None


@contextmanager
def atomic_destination(dst: str, is_dir: bool, force: bool, err=None):
    """Yield the temporary path to write; on success it becomes `dst`."""
    check_destination(dst, force)
    remove_stale_temporaries(dst, err)
    shown, dst = dst, os.path.abspath(dst)
    parent, name = os.path.split(dst)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    temporary = os.path.join(parent, f".{name}.tmp-{token}")
    try:
        if is_dir:
            os.mkdir(temporary)
        yield temporary
        _commit(temporary, dst, os.path.join(parent, f".{name}.old-{token}"))
    except BaseException as error:
        _remove(temporary)
        reworded = _naming_dst(error, temporary, shown) if isinstance(error, OSError) else None
        if reworded is not None:
            raise reworded from None
        raise
    fsync_dir(parent)


def _commit(temporary: str, dst: str, old: str) -> None:
    """Rename `temporary` to `dst` with stop signals held; one that arrives meanwhile is spent: the work is done."""
    held = {}
    if threading.current_thread() is threading.main_thread():
        held = {signum: signal.signal(signum, lambda *_: None) for signum in _STOP_SIGNALS}
    try:
        if os.path.lexists(dst):
            os.rename(dst, old)
            try:
                os.rename(temporary, dst)
            except OSError:
                os.rename(old, dst)
                raise
            _remove(old)
        else:
            os.rename(temporary, dst)
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
