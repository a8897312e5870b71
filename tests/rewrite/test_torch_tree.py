"""Robustness: `rewrite --check` over the whole installed torch package.

Thousands of real files, FSDP1's own implementation among them: the run must
finish without an internal error or a file it cannot parse, and write nothing.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path


def test_check_over_installed_torch_crashes_on_nothing_and_writes_nothing():
    root = Path(next(iter(importlib.util.find_spec("torch").submodule_search_locations)))
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*.py")}
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", "--check", str(root)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert " MF002 " not in done.stdout, [line for line in done.stdout.splitlines() if " MF002 " in line]
    assert " MF001 " not in done.stdout, [line for line in done.stdout.splitlines() if " MF001 " in line]
    assert f"({len(before)} scanned)" in done.stderr
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*.py")}
    assert after == before
    assert not list(root.rglob("*.migrate-fsdp.tmp"))
