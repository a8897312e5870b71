"""Shared test helpers: launching real multi-process torchrun jobs, and the fixtures folder.

Import as `from tests.support import torchrun, FIXTURES`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
RANK_ENTRY = REPO / "tests" / "rank_entry.py"


def torchrun(script, *args, nproc: int = 2, timeout: float = 300, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Run `script` on `nproc` local ranks (gloo on CPU) and return the finished process.

    Each rank runs the script through rank_entry.py, which skips the interpreter teardown where gloo
    sometimes aborts a rank that has finished.

    Fails the test with both output streams when the job does not exit 0.
    """
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(RANK_ENTRY), str(script), *map(str, args),
    ]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env)
    if done.returncode != 0:
        pytest.fail(f"torchrun {script} {' '.join(map(str, args))} exited {done.returncode}\n"
                    f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-8000:]}")
    return done


def step_lines(stdout: str) -> list[str]:
    """The `step N ...` lines a runnable fixture prints on rank 0."""
    return [line for line in stdout.splitlines() if line.startswith("step ")]
