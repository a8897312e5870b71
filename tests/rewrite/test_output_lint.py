"""The rewrite adds no pyflakes finding: `ruff check --select F` on every fixture's output and on the
rewrites of the runnable training scripts finds nothing that the input did not have already.

The fixture projects' after/ files are checked against their before/ ones.
Findings are compared by code and message, line numbers dropped (the rewrite moves lines).
"""

import json
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from migrate_fsdp.rewrite.api import rewrite_source
from tests.support import FIXTURES

pytestmark = pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff (the `test` extra) is not installed")

CASES = sorted(p for p in (FIXTURES / "rewrite").iterdir() if p.is_dir())
SCRIPTS = sorted([*(FIXTURES / "train").glob("*/fsdp1.py"), *(FIXTURES / "construction").glob("*/fsdp1.py")])
PROJECT_FILES = sorted(
    path.relative_to(FIXTURES / "projects")
    for path in (FIXTURES / "projects").glob("*/before/**/*.py")
)


def pyflakes_findings(path: Path) -> Counter:
    done = subprocess.run(
        ["ruff", "check", "--isolated", "--select", "F", "--output-format", "json", "--exit-zero", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    # "Redefinition of unused `x` from line 5": the rewrite moves lines, the finding is the same
    return Counter((f["code"], re.sub(r"line \d+", "line N", f["message"])) for f in json.loads(done.stdout))


def new_findings(before: Path, after: Path) -> Counter:
    return pyflakes_findings(after) - pyflakes_findings(before)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_output_adds_no_pyflakes_finding(case):
    assert new_findings(case / "before.py", case / "after.py") == Counter()


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.parent.name for s in SCRIPTS])
def test_runnable_rewrite_adds_no_pyflakes_finding(script, tmp_path):
    rewritten = tmp_path / "fsdp2.py"
    rewritten.write_bytes(rewrite_source(script.read_bytes(), str(script)).new_source)
    assert new_findings(script, rewritten) == Counter()


@pytest.mark.parametrize("path", PROJECT_FILES, ids=[str(p) for p in PROJECT_FILES])
def test_project_output_adds_no_pyflakes_finding(path):
    case, _, inside = str(path).partition("/before/")
    root = FIXTURES / "projects" / case
    assert new_findings(root / "before" / inside, root / "after" / inside) == Counter()
