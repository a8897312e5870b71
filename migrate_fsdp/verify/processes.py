"""Finding and ending every process a torchrun launch started.

torchrun puts each rank in a session of its own (`start_new_session=True` in
torch.distributed.elastic's SubprocessHandler), so killing torchrun's process
group does not reach the ranks, and a rank orphaned by a dead torchrun is no
longer its descendant. The launcher therefore records the process tree while
the run is alive and ends every group it saw. Linux /proc only; elsewhere just
the launched process group is ended.
"""

import os
import signal
import time
from pathlib import Path

_PROC = Path("/proc")


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a live process, or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live process below `root` (root included)."""
    if not _PROC.is_dir():
        return {}
    parents, starts = {}, {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)], starts[int(entry.name)] = stat[0], stat[1]
    found = {root: starts[root]} if root in starts else {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = starts[pid]
                frontier.append(pid)
    return found


def alive(pid: int, start: int) -> bool:
    """Whether this very process (not a later one reusing its pid) still runs."""
    stat = _stat(pid)
    return stat is not None and stat[1] == start and stat[2] != "Z"


def _signal_all(processes: dict[int, int], sig: int) -> None:
    for pid, start in processes.items():
        if not alive(pid, start):
            continue
        try:
            if os.getpgid(pid) == pid:  # a group leader: torchrun or a rank; reaches its children too
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass


def end_all(leader: int, seen: dict[int, int], grace: float = 5.0) -> None:
    """SIGTERM the groups of the leader and of every process seen under it, then SIGKILL what is left."""
    if not _PROC.is_dir():
        try:
            os.killpg(leader, signal.SIGTERM)
            time.sleep(grace)
            os.killpg(leader, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    processes = {**seen, **descendants(leader)}
    _signal_all(processes, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p, s) for p, s in processes.items()):
        time.sleep(0.05)
    processes.update(descendants(leader))
    _signal_all(processes, signal.SIGKILL)


def leftovers(seen: dict[int, int]) -> dict[int, int]:
    return {pid: start for pid, start in seen.items() if alive(pid, start)}
