"""The per-rank metrics file: JSON lines written by the probe, read by the driver.

One file per rank, appended and flushed line by line, so that a rank that
crashes or hangs still leaves behind everything it measured up to that point.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

# How the launcher tells the probe in each rank what to do.
ENV_DIR = "MIGRATE_FSDP_VERIFY_DIR"  # where the rank files go
ENV_STEPS = "MIGRATE_FSDP_VERIFY_STEPS"  # stop after this many optimizer steps; empty: run to the end


def metrics_path(directory, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.jsonl"


def stdout_path(directory, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.stdout"


def stderr_path(directory, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.stderr"


class MetricsWriter:
    def __init__(self, path: Path):
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, event: str, **fields) -> None:
        self._file.write(json.dumps({"event": event, **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@dataclass
class RankMetrics:
    """What one rank reported, in the order it happened."""

    rank: int
    world_size: int = 0
    started: bool = False
    setups: list = field(default_factory=list)  # one per optimizer, in the order they first stepped
    steps: list = field(default_factory=list)
    saves: list = field(default_factory=list)  # checkpoints written, in order: {"kind", "path"}
    end: dict | None = None

    @property
    def status(self) -> str:
        """`stopped` (reached --steps), `finished`, `exit`, `error`, or `missing` (killed, hung)."""
        return self.end["status"] if self.end else "missing"


def read_rank(path: Path, rank: int) -> RankMetrics:
    metrics = RankMetrics(rank=rank)
    if not path.exists():
        return metrics
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            break  # a rank killed mid-write leaves a torn last line
        event = record.pop("event")
        if event == "start":
            metrics.started = True
            metrics.world_size = record["world_size"]
        elif event == "setup":
            metrics.setups.append(record)
        elif event == "step":
            metrics.steps.append(record)
        elif event == "save":
            metrics.saves.append(record)
        elif event == "end":
            metrics.end = record
    return metrics
