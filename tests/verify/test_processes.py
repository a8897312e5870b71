"""Ending a launch completely, including children that started sessions of their own (as torchrun's ranks do)."""

import os
import subprocess
import sys
import time

from migrate_fsdp.verify import processes

# A parent that starts two children in new sessions (like torchrun's ranks), each with a grandchild.
TREE = """
import subprocess, sys, time
child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
for _ in range(2):
    subprocess.Popen([sys.executable, "-c", child], start_new_session=True)
time.sleep(600)
"""


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_end_all_reaches_processes_in_other_sessions():
    leader = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    try:
        assert wait_for(lambda: len(processes.descendants(leader.pid)) == 5)
        seen = processes.descendants(leader.pid)
        assert {os.getpgid(pid) for pid in seen} >= {leader.pid}
        assert len({os.getpgid(pid) for pid in seen}) == 3  # the leader's group and one per child session
        processes.end_all(leader.pid, seen, grace=2.0)
        leader.wait(timeout=10)
        assert wait_for(lambda: not processes.leftovers(seen), timeout=5)
    finally:
        if leader.poll() is None:
            leader.kill()


def test_alive_tells_a_reused_pid_from_the_original():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = processes.descendants(proc.pid)[proc.pid]
        assert processes.alive(proc.pid, start)
        assert not processes.alive(proc.pid, start + 1)
    finally:
        proc.kill()
        proc.wait()
    assert not processes.alive(proc.pid, start)
