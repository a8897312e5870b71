"""All or nothing: the output is built beside DST under a temporary name and renamed into place at the end.

A rename within one directory is atomic, so DST is either absent (or the old
one, with --force) or complete; Ctrl-C, SIGTERM or any error removes the
temporary output instead. Replacing an existing DST takes two renames (old
aside, new in place); Ctrl-C and SIGTERM are held back between them, so an
interruption can never leave DST missing.
"""

import os
import secrets
import shutil
import signal
import threading
from contextlib import contextmanager

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.fileio import fsync_dir

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


@contextmanager
def atomic_destination(dst: str, is_dir: bool, force: bool):
    """Yield the temporary path to write; on success it becomes `dst`."""
    check_destination(dst, force)
    dst = os.path.abspath(dst)
    parent, name = os.path.split(dst)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    temporary = os.path.join(parent, f".{name}.tmp-{token}")
    try:
        if is_dir:
            os.mkdir(temporary)
        yield temporary
    except BaseException:
        _remove(temporary)
        raise
    _commit(temporary, dst, os.path.join(parent, f".{name}.old-{token}"))
    fsync_dir(parent)


def _commit(temporary: str, dst: str, old: str) -> None:
    """Rename `temporary` to `dst` with stop signals held; one that arrives meanwhile is spent: the work is done."""
    held = {}
    if threading.current_thread() is threading.main_thread():
        held = {signum: signal.signal(signum, lambda *_: None) for signum in _STOP_SIGNALS}
    try:
        if os.path.lexists(dst):
            os.rename(dst, old)
            os.rename(temporary, dst)
            _remove(old)
        else:
            os.rename(temporary, dst)
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
