"""When a run counts as hung.

An explicit --timeout is a deadline for a whole run. Without one, a flat
deadline would have to be long enough for the slowest real script, so a hang
would be found only after it, on each side. Instead a run is hung when, once
it has stepped, it makes no progress (no rank writes a metrics record) for
STALL_FACTOR times the longest gap between records seen so far, in this run or
in a side run before it, and never less than MIN_STALL_S; before its first
optimizer step it has START_S, or STALL_FACTOR times what an earlier side took
to get there. The longest gap includes whatever the script does between steps
(an evaluation, a checkpoint), so a second side is judged by the first one's
pace.
"""

import time
from dataclasses import dataclass
from pathlib import Path

STALL_FACTOR = 10.0
MIN_STALL_S = 60.0
START_S = 300.0
_STEP = b'"event": "step"'  # as metrics.MetricsWriter writes it
UNWATCHED_S = 600.0  # a set-up step runs without the probe, so without records: a flat deadline


@dataclass
class Pace:
    """What the runs of one verify have shown so far, shared by its sides."""

    startup_s: float | None = None  # launch to the first optimizer step, the longest seen
    slowest_gap_s: float = 0.0  # between two records of a run, the longest seen


class Watchdog:
    """Watches one run's metrics files; `hung()` says when to end it, `why()` what to report."""

    def __init__(self, directory: Path, timeout: float | None, pace: Pace, watched: bool = True,
                 started: float | None = None):
        self.directory = directory
        self.timeout = timeout if timeout is not None or watched else UNWATCHED_S
        self.pace = pace
        self.started = time.monotonic() if started is None else started
        self.last_progress: float | None = None  # None until the first optimizer step
        self._read: dict[Path, int] = {}  # bytes of each rank's metrics file seen so far

    def _limit(self) -> float:
        if self.last_progress is None:
            known = self.pace.startup_s
            return START_S if known is None else max(MIN_STALL_S, STALL_FACTOR * known)
        return max(MIN_STALL_S, STALL_FACTOR * self.pace.slowest_gap_s)

    def _new_records(self) -> bytes:
        new = b""
        for path in self.directory.glob("rank*.jsonl"):
            seen = self._read.get(path, 0)
            try:
                with path.open("rb") as handle:
                    handle.seek(seen)
                    chunk = handle.read()
            except OSError:
                continue
            self._read[path] = seen + len(chunk)
            new += chunk
        return new

    def _observe(self, now: float) -> None:
        new = self._new_records()
        if not new:
            return
        if self.last_progress is None:
            if _STEP not in new:
                return  # still starting: imports, model, data
            self.pace.startup_s = max(self.pace.startup_s or 0.0, now - self.started)
        else:
            self.pace.slowest_gap_s = max(self.pace.slowest_gap_s, now - self.last_progress)
        self.last_progress = now

    def hung(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self.timeout is not None:
            return now - self.started >= self.timeout
        self._observe(now)
        return now - (self.last_progress or self.started) >= self._limit()

    def why(self) -> str:
        if self.timeout is not None:
            return f"still running after --timeout {self.timeout:g}s"
        if self.last_progress is None:
            return f"no optimizer step within {self._limit():.0f}s of the start (pass --timeout S to allow longer)"
        return (f"no progress for {self._limit():.0f}s ({STALL_FACTOR:g} x the slowest step so far, at least "
                f"{MIN_STALL_S:g}s; pass --timeout S to allow longer)")
