"""Temporaries left by a killed run: their names carry the writer's PID, so a later run can tell them from the
temporaries of a run still going and remove only those of dead processes."""

import os
import re
import shutil


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def remove_stale(directory: str, pattern: re.Pattern) -> list[str]:
    """Remove the entries of `directory` that `pattern` (with a group named `pid`) matches and whose process is
    dead; return their paths. What cannot be listed or removed is left alone: it is not this run's business."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        match = pattern.fullmatch(name)
        if not match or pid_alive(int(match["pid"])):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed
