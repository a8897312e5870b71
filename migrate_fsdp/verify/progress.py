"""The live line while runs train: `old: step 12/?? 0.8 s/step`, rewritten in place on a terminal.

A long real script otherwise looks hung for minutes. The steps are counted
from rank 0's metrics file (read from where the last look stopped, so a long
run costs no more than a short one). Off a terminal (a CI log, a pipe)
nothing is written: a log would fill with carriage returns.
"""

import sys
import time

from migrate_fsdp.verify import metrics


class _Count:
    def __init__(self, path):
        self.path, self.offset, self.steps = path, 0, 0
        self.since = None  # (time, steps) when steps were first seen: the rate is measured from there

    def update(self) -> int:
        try:
            with open(self.path, "rb") as file:
                file.seek(self.offset)
                chunk = file.read()
        except OSError:
            return self.steps
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written is read next time
        self.offset += len(complete)
        self.steps += complete.count(b'"event": "step"')
        if self.steps and self.since is None:
            self.since = (time.monotonic(), self.steps)
        return self.steps

    def rate(self) -> str:
        if self.since is None or self.steps == self.since[1]:
            return ""
        return f" {(time.monotonic() - self.since[0]) / (self.steps - self.since[1]):.2g} s/step"


class LiveLine:
    def __init__(self, total: int | None, stream=None):
        self.total = total
        self.stream = stream or sys.stdout
        self._counts = {}
        self._shown = ""

    @classmethod
    def for_terminal(cls, total: int | None):
        return cls(total) if sys.stdout.isatty() else None

    def update(self, running: list) -> None:
        parts = []
        for run in running:
            count = self._counts.setdefault(id(run), _Count(metrics.metrics_path(run.directory, 0)))
            steps = count.update()
            parts.append(f"{run.side.name}: step {steps}/{self.total or '??'}{count.rate()}")
        text = "   ".join(parts)
        if text != self._shown:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
            self._shown = text

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = ""
        self._counts.clear()
