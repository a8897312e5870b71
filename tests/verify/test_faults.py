"""Runs that cannot be compared: each is reported with its side, rank and stderr, and nothing is left running.

These launch real torchrun jobs with 2 gloo ranks.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from migrate_fsdp.verify.faults import run_failures
from migrate_fsdp.verify.launcher import Side, run_sides
from tests.verify.helpers import CPU, REPO, SCRIPTS, launch, verify

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

FAULTY = SCRIPTS / "faulty.py"


def one_side(tmp_path, *args, steps=3, timeout=60.0):
    the_launch = launch(steps)
    the_launch.timeout = timeout
    [run] = run_sides([Side("old", FAULTY, list(args), shown="faulty.py")], the_launch, CPU, tmp_path)
    return run, run_failures(run, steps, timeout)


def processes_with(tag: str) -> list:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if tag.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:
            pass
    return found


def test_a_crashing_rank_is_reported_with_side_rank_and_stderr_tail(tmp_path):
    done = verify(FAULTY, "--new", FAULTY, "--steps", "3", "--logs", tmp_path, "--", "--fault", "crash")
    assert done.returncode == 2, done.stdout + done.stderr
    message = "old run (" + str(FAULTY) + ") crashed on rank 1: RuntimeError: injected failure on rank 1"
    assert done.stderr == f"migrate-fsdp verify: error: {message}\n"
    assert message in done.stdout
    assert "    | RuntimeError: injected failure on rank 1" in done.stdout  # the rank's own traceback
    assert "new run (" in done.stdout and done.stdout.rstrip().endswith("verdict: NOT RUN")
    assert (tmp_path / "old" / "rank1.stderr").read_text().count("Traceback") == 1  # --logs keeps them


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process accounting reads /proc")
def test_a_hang_is_killed_at_the_timeout_with_every_process(tmp_path):
    tag = uuid.uuid4().hex
    run, failures = one_side(tmp_path, "--fault", "hang", "--tag", tag, timeout=12)
    assert run.timed_out
    # Rank 0 hangs at step 1; on a loaded machine the deadline may come before the ranks even got there.
    reached = min(len(rank.steps) for rank in run.ranks)
    assert reached <= 1
    assert [f.message for f in failures] == [
        f"old run (faulty.py) hung: still running after --timeout 12s, at optimizer step {reached} of 3; "
        "all its processes were killed"]
    assert processes_with(tag) == []


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process accounting reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_verify_ends_its_runs(sig, tmp_path):
    tag = uuid.uuid4().hex
    command = [sys.executable, "-m", "migrate_fsdp", "verify", "--device", "cpu", FAULTY, "--new", FAULTY,
               "--logs", tmp_path, "--", "--fault", "hang", "--tag", tag]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    # Interrupt once both ranks have trained a step (rank 0 then hangs): an event, not a guess at how long
    # starting torchrun takes on a busy machine.
    metrics = [tmp_path / "old" / f"rank{rank}.jsonl" for rank in (0, 1)]
    while not all(path.is_file() and '"step"' in path.read_text() for path in metrics):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    left = processes_with(tag)
    for pid in left:  # so that a failure here leaves no hung ranks behind either
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    assert proc.returncode == 130
    assert stderr == "migrate-fsdp verify: error: interrupted; the runs it had started were ended\n"
    assert left == []


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process accounting reads /proc")
def test_killing_verify_takes_torchrun_and_the_ranks_down():
    tag = uuid.uuid4().hex
    command = [sys.executable, "-m", "migrate_fsdp", "verify", "--device", "cpu", FAULTY, "--new", FAULTY,
               "--", "--fault", "hang", "--tag", tag]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    deadline = time.monotonic() + 60
    while len(processes_with(tag)) < 4 and time.monotonic() < deadline:  # verify, torchrun, 2 ranks
        time.sleep(0.2)
    proc.kill()  # no handler runs: only the kernel can end what verify started
    proc.wait()
    deadline = time.monotonic() + 30
    while processes_with(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with(tag)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    assert left == []


def test_an_earlier_runs_files_in_a_kept_log_directory_are_not_read(tmp_path):
    (tmp_path / "old").mkdir()
    stale = '{"event": "step", "step": 0, "loss": 1.0}\n'
    for rank in (0, 1):
        (tmp_path / "old" / f"rank{rank}.jsonl").write_text(stale)
    run, failures = one_side(tmp_path, "--fault", "none", steps=2)
    assert failures == [] and [len(r.steps) for r in run.ranks] == [2, 2]


def test_a_script_that_never_steps_an_optimizer(tmp_path):
    run, failures = one_side(tmp_path, "--fault", "no-step")
    assert run.returncode == 0
    assert [f.message for f in failures] == [
        "old run (faulty.py) never called an optimizer's step(): verify compares training steps, "
        "so the script must run at least one"]


def test_a_script_shorter_than_the_steps_asked_for_is_no_failure(tmp_path):
    run, failures = one_side(tmp_path, "--fault", "short", steps=4)
    assert failures == [] and [r.status for r in run.ranks] == ["finished", "finished"]
    assert [len(r.steps) for r in run.ranks] == [2, 2]


def test_a_healthy_run_stops_cleanly_after_the_steps_asked_for(tmp_path):
    run, failures = one_side(tmp_path, "--fault", "none", steps=3)
    assert failures == [] and run.returncode == 0 and not run.timed_out
    assert [r.status for r in run.ranks] == ["stopped", "stopped"]
    assert [len(r.steps) for r in run.ranks] == [3, 3]


@pytest.mark.slow
def test_a_rank_that_steps_fewer_times_is_named_as_the_cause(tmp_path):
    _, failures = one_side(tmp_path, "--fault", "uneven", steps=6)
    first, *_ = [f.message for f in failures]
    assert first.startswith(
        "old run (faulty.py): rank 1 stopped after 2 optimizer steps while rank 0 went on; rank 0 then failed: ")
    assert "every rank must step the same number of times" in first
