"""Child processes that end with their parent: a worker pool or a torchrun left behind by a killed `migrate-fsdp`
would otherwise live on under PID 1, blocked on a pipe or training for nobody.

Linux delivers a chosen signal to a process when its parent dies (prctl PR_SET_PDEATHSIG); other systems have no
such call, and there this is a no-op.
"""

import ctypes
import ctypes.util
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Have `sig` sent to this process when its parent dies (call it in the child: a pool's initializer, or a
    Popen preexec_fn). `parent`: the PID the parent had, to catch a parent that died before the call."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return  # a sandbox that forbids prctl: the parent's own clean-up still applies
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def with_lifeline(parent: int, initializer, *args) -> None:
    """A pool initializer: die with `parent`, then run `initializer(*args)`."""
    die_with_parent(parent=parent)
    initializer(*args)
