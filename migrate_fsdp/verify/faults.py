"""Why a run could not be compared: a crash, a hang, a script that never trained.

A script shorter than --steps is no failure: the steps it ran are compared
(see compare.py); two versions that step a different number of times are a
parity failure, not a run that could not be done.
"""

from dataclasses import dataclass

from migrate_fsdp.verify import metrics

TAIL_LINES = 15
_PEER_GONE = ("by peer", "Broken pipe")


@dataclass
class RunFailure:
    side: str
    message: str  # one line
    tail: str = ""  # the end of the failing rank's stderr (or of torchrun's output)


def _tail(path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _lost_a_peer(error: str) -> bool:
    """A collective that failed because another rank was gone (gloo: "Connection reset/closed by peer")."""
    return any(sign in error for sign in _PEER_GONE)


def run_failures(run, steps: int | None, timeout: float | None) -> list:
    side = run.side.name
    name = f"{side} run ({run.side.shown})"
    done = min((len(rank.steps) for rank in run.ranks), default=0)
    if run.timed_out:
        slowest = min(run.ranks, key=lambda r: len(r.steps), default=None)
        tail = _tail(metrics.stderr_path(run.directory, slowest.rank)) if slowest else ""
        of = f" of {steps}" if steps else ""
        why = run.hang or f"still running after --timeout {timeout:g}s"
        return [RunFailure(side, f"{name} hung: {why}, at optimizer step {done}{of}; all its processes were killed",
                           tail)]
    if not run.side.watched:
        if run.returncode != 0:
            return [RunFailure(side, f"{name} failed with torchrun exit status {run.returncode}",
                               _tail(run.torchrun_log))]
        return []
    # One rank's crash usually makes the others fail in their next collective; the first error is the cause.
    errors = sorted((r for r in run.ranks if r.status == "error"), key=lambda r: r.end.get("time", 0))
    ended = [r for r in run.ranks if r.status == "finished"]
    if errors and ended and all(_lost_a_peer(r.end["error"]) for r in errors):
        early, first = ended[0], errors[0]
        return [RunFailure(side, f"{name}: rank {early.rank} stopped after {len(early.steps)} optimizer steps while "
                                 f"rank {first.rank} went on; rank {first.rank} then failed: {first.end['error']} "
                                 "(every rank must step the same number of times)",
                           _tail(metrics.stderr_path(run.directory, early.rank)))]
    if errors:
        first, *others = errors
        failures = [RunFailure(side, f"{name} crashed on rank {first.rank}: {first.end['error']}",
                               _tail(metrics.stderr_path(run.directory, first.rank)))]
        failures += [RunFailure(side, f"{name}: rank {r.rank} failed after that: {r.end['error']}") for r in others]
        return failures
    exits = [r for r in run.ranks if r.status == "exit"]
    if exits:
        return [RunFailure(side, f"{name}: rank {r.rank} exited with status {r.end['exit_code']}",
                           _tail(metrics.stderr_path(run.directory, r.rank))) for r in exits]
    if run.returncode != 0:
        lost = [r.rank for r in run.ranks if r.status == "missing"]
        where = f"rank {', '.join(map(str, lost))} ended" if lost else "torchrun ended"
        return [RunFailure(side, f"{name} failed: {where} without a Python error (torchrun exit status "
                                 f"{run.returncode}; killed by a signal or out of memory?)", _tail(run.torchrun_log))]
    if done == 0:
        return [RunFailure(side, f"{name} never called an optimizer's step(): verify compares training steps, "
                                 "so the script must run at least one")]
    return []
