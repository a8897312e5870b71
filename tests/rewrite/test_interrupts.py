"""`rewrite` interrupted: Ctrl-C and SIGTERM exit 130 and leave no temporary; a killed run leaves no worker behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.rewrite.test_hostile import CONVERTED, FSDP1_HEADER, chain


def start(*args):
    return subprocess.Popen(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            pass
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def slow_tree(root: Path, files: int = 2) -> Path:
    for i in range(files):
        (root / f"generated_{i}.py").write_text(FSDP1_HEADER + chain(1500))  # seconds to parse
    return root


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the workers through /proc")
def test_killing_the_main_process_takes_its_workers_down(tmp_path):
    process = start("--check", "--jobs", "2", slow_tree(tmp_path))
    deadline = time.monotonic() + 60
    while len(workers := children(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) >= 2, "the workers never started"
    time.sleep(0.5)  # parsing
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in workers), "orphaned workers"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_while_parsing_exits_130(tmp_path, signum):
    process = start("--jobs", "2", slow_tree(tmp_path))
    time.sleep(2)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert stderr == "migrate-fsdp rewrite: error: interrupted; files already rewritten were each replaced whole\n"


def test_sigterm_mid_write_leaves_each_file_whole_and_no_temporary(tmp_path):
    padding = "x = '" + "a" * (8 << 20) + "'\n"  # 8 MB written and fsync'ed per file: the temporary lives a while
    for i in range(6):
        (tmp_path / f"train_{i}.py").write_text(FSDP1_HEADER + padding)
    process = start("--jobs", "1", tmp_path)
    deadline = time.monotonic() + 120
    while process.poll() is None and time.monotonic() < deadline:
        if any(name.endswith(".migrate-fsdp.tmp") for name in os.listdir(tmp_path)):
            break
        time.sleep(0.001)
    os.kill(process.pid, signal.SIGSTOP)  # frozen mid-write
    assert process.poll() is None, "the run ended before it could be interrupted"
    assert any(name.endswith(".migrate-fsdp.tmp") for name in os.listdir(tmp_path))
    os.kill(process.pid, signal.SIGTERM)
    os.kill(process.pid, signal.SIGCONT)
    process.communicate(timeout=60)
    assert process.returncode == 130
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == []
    for path in tmp_path.glob("*.py"):
        assert path.read_text() in (FSDP1_HEADER + padding, CONVERTED + padding)
