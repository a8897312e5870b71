"""Whole fixture projects rewritten as one program: exact output per file, exact diagnostics, a fixed point.

A case is `fixtures/projects/<case>/` with `before/` (the project), `after/`
(every file exactly as the rewrite leaves it) and `diagnostics.txt` (the
report, paths relative to the project). A model whose constructor stays
FSDP1 keeps every use of it byte for byte: only TODO lines are added.
"""

import shutil
from pathlib import Path

import libcst as cst
import pytest

from migrate_fsdp.rewrite.runner import run
from migrate_fsdp.rewrite.selection import Selection
from tests.support import FIXTURES

CASES = sorted(p for p in (FIXTURES / "projects").iterdir() if p.is_dir())
TODO = "# TODO(migrate-fsdp):"


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.py"))}


def _rewrite(project: Path, jobs: int):
    return run(["."], Selection.from_prefixes(None, None), exclude=[], jobs=jobs, todo=True, write=True)


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_project(case, jobs, tmp_path, monkeypatch):
    project = tmp_path / "project"
    shutil.copytree(case / "before", project)
    monkeypatch.chdir(project)
    result = _rewrite(project, jobs)

    assert [str(d) for d in result.diagnostics] == (case / "diagnostics.txt").read_text().splitlines()
    assert _files(project) == _files(case / "after")
    for code in _files(project).values():
        cst.parse_module(code)

    again = _rewrite(project, jobs)
    assert not again.changed, "a second run changes the project"
    said = {(d.path, d.code, d.message) for d in result.diagnostics}
    assert {(d.path, d.code, d.message) for d in again.diagnostics} <= said, "a second run says something new"


def test_blocked_constructor_leaves_every_use_as_it_was():
    case = FIXTURES / "projects" / "blocked_constructor"
    before, after = _files(case / "before"), _files(case / "after")
    for path in ("pkg/train.py", "pkg/steps.py"):
        kept = [line for line in after[path].splitlines() if not line.strip().startswith(TODO)]
        assert kept == before[path].splitlines(), path


def test_untouched_projects_are_untouched():
    for name in ("not_torch_fsdp",):
        case = FIXTURES / "projects" / name
        assert _files(case / "before") == _files(case / "after")
        assert (case / "diagnostics.txt").read_text() == ""
