"""A progress bar in bytes on stderr (only on a terminal) and the closing summary's figures."""

import sys
import time


def human_bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.2f} {unit}"
        count /= 1000
    return f"{count:.2f} TB"


class Progress:
    """Called with each number of bytes written; redraws at most ten times a second."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.total, self.done = max(total, 1), 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.started = self._drawn = time.monotonic()

    def __call__(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        if self.enabled and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        fraction = min(1.0, self.done / self.total)
        filled = int(fraction * 30)
        rate = self.done / max(now - self.started, 1e-9)
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {human_bytes(self.done)} / {human_bytes(self.total)} "
            f"{fraction:4.0%} {human_bytes(rate)}/s "
        )
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started
