"""A run is hung when it stops making progress, judged by its own pace and by the sides before it."""

import json
import uuid

import pytest

from migrate_fsdp.verify import timeouts
from migrate_fsdp.verify.timeouts import Pace, Watchdog
from tests.verify.test_faults import one_side, processes_with


class Run:
    """A run's metrics directory, written by hand on a fake clock."""

    def __init__(self, directory):
        self.file = directory / "rank0.jsonl"
        directory.mkdir(exist_ok=True)

    def record(self, event="step"):
        with self.file.open("a") as handle:
            handle.write(json.dumps({"event": event}) + "\n")


def test_a_run_that_stops_stepping_is_hung_after_ten_times_its_slowest_step(tmp_path):
    run, pace = Run(tmp_path / "old"), Pace()
    watchdog = Watchdog(tmp_path / "old", None, pace, started=0.0)
    for now in (5.0, 8.0, 16.0):  # started after 5 s, then steps of 3 s and 8 s
        run.record()
        assert not watchdog.hung(now)
    assert not watchdog.hung(16.0 + 79.0)
    assert watchdog.hung(16.0 + 80.0)
    assert watchdog.why().startswith("no progress for 80s (10 x the slowest step so far")


def test_the_floor_and_the_start_allowance(tmp_path):
    run, pace = Run(tmp_path / "old"), Pace()
    watchdog = Watchdog(tmp_path / "old", None, pace, started=0.0)
    run.record("start")  # a rank started, but it has not stepped yet
    assert not watchdog.hung(timeouts.START_S - 1) and watchdog.hung(timeouts.START_S)
    assert watchdog.why().startswith(f"no optimizer step within {timeouts.START_S:.0f}s of the start")
    watchdog = Watchdog(tmp_path / "old", None, Pace(), started=0.0)
    run.record()
    watchdog.hung(1.0)
    run.record()
    watchdog.hung(1.2)  # fast steps: the floor applies
    assert not watchdog.hung(1.2 + timeouts.MIN_STALL_S - 1) and watchdog.hung(1.2 + timeouts.MIN_STALL_S)


def test_the_second_side_is_judged_by_the_first_ones_pace(tmp_path):
    pace = Pace()
    old, new = Run(tmp_path / "old"), Run(tmp_path / "new")
    first = Watchdog(tmp_path / "old", None, pace, started=0.0)
    old.record()
    first.hung(10.0)  # 10 s to start
    old.record()
    first.hung(30.0)  # a 20 s gap (an evaluation between steps)
    second = Watchdog(tmp_path / "new", None, pace, started=100.0)
    assert not second.hung(100.0 + 99.0) and second.hung(100.0 + 100.0)  # 10 x 10 s to start
    new.record()
    second.hung(205.0)
    assert not second.hung(205.0 + 199.0) and second.hung(205.0 + 200.0)  # 10 x the old side's 20 s gap


def test_an_explicit_timeout_is_a_deadline_for_the_whole_run(tmp_path):
    run = Run(tmp_path / "old")
    watchdog = Watchdog(tmp_path / "old", 12.0, Pace(), started=0.0)
    run.record()
    assert not watchdog.hung(11.9) and watchdog.hung(12.0)
    assert watchdog.why() == "still running after --timeout 12s"


def test_a_set_up_step_without_records_has_a_flat_deadline(tmp_path):
    watchdog = Watchdog(tmp_path, None, Pace(), watched=False, started=0.0)
    assert not watchdog.hung(timeouts.UNWATCHED_S - 1) and watchdog.hung(timeouts.UNWATCHED_S)


@pytest.mark.slow
def test_a_real_hang_is_found_by_its_stall_without_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(timeouts, "MIN_STALL_S", 4.0)
    tag = uuid.uuid4().hex
    run, failures = one_side(tmp_path, "--fault", "hang", "--tag", tag, timeout=None)
    assert run.timed_out and run.wall_s < 60
    [failure] = failures
    assert failure.message.startswith("old run (faulty.py) hung: no progress for 4s (10 x the slowest step so far")
    assert failure.message.endswith("at optimizer step 1 of 3; all its processes were killed")
    assert processes_with(tag) == []
