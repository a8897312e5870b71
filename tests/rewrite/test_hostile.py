"""Hostile input to `rewrite`: code nested as deeply as CPython allows, and deeper; symbolic and hard links, other
owners, files that cannot be read or written."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from migrate_fsdp.rewrite import report
from migrate_fsdp.rewrite.api import rewrite_source
from migrate_fsdp.rewrite.runner import run
from migrate_fsdp.rewrite.selection import Selection

FSDP1_HEADER = "import torch.distributed.fsdp as fsdp\n\nmodel = fsdp.FullyShardedDataParallel(model)\n"


def chain(terms: int) -> str:
    return "total = " + " + ".join(f"parts[{i}]" for i in range(terms)) + "\n"


def test_a_long_generated_sum_is_rewritten():
    source = FSDP1_HEADER + chain(320)
    result = rewrite_source(source, "generated.py")
    assert result.diagnostics == []
    assert result.code == (
        "from torch.distributed.fsdp import fully_shard\n\n"
        "fully_shard(model)\n" + chain(320)
    )
    compile(result.code, "generated.py", "exec")
    assert rewrite_source(result.code, "generated.py").changed is False  # a fixed point


def test_the_command_and_its_workers_take_it(tmp_path):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(FSDP1_HEADER + chain(320))
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", "--jobs", "2", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MF002" not in done.stdout and "Rewrote 2 files" in done.stderr
    for name in ("a.py", "b.py"):
        assert "FullyShardedDataParallel" not in (tmp_path / name).read_text()


def test_nesting_python_refuses_is_a_parse_finding_not_a_crash(tmp_path):
    path = tmp_path / "deep.py"
    path.write_text(FSDP1_HEADER + "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    before = path.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == f"{path}:1:1: MF001 nested deeper than Python compiles (too many nested parentheses); file skipped\n"
    assert path.read_bytes() == before


CONVERTED = "from torch.distributed.fsdp import fully_shard\n\nfully_shard(model)\n"


def migrate(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def run_here(tmp_path, monkeypatch, *paths):
    """The run in this process (so that a failing disk can be simulated), as the command runs it."""
    monkeypatch.chdir(tmp_path)
    result = run(list(paths), Selection.from_prefixes(None, None), exclude=[], jobs=1, todo=True, write=True)
    return result, report.summary(result, "write")


def test_symlinks_in_a_tree_are_skipped_even_broken_ones(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (tree / "train.py").write_text(FSDP1_HEADER)
    (outside / "shared.py").write_text(FSDP1_HEADER)
    (tree / "shared.py").symlink_to(outside / "shared.py")
    (tree / "broken.py").symlink_to(tmp_path / "gone.py")
    done = migrate(tree)
    assert done.returncode == 0, done.stderr
    assert "Rewrote 1 file (1 scanned)" in done.stderr
    assert (tree / "train.py").read_text() == CONVERTED
    assert (outside / "shared.py").read_text() == FSDP1_HEADER
    assert (tree / "shared.py").is_symlink() and (tree / "broken.py").is_symlink()


def test_a_symlink_named_explicitly_has_its_target_rewritten_and_stays_a_link(tmp_path):
    (tmp_path / "real.py").write_text(FSDP1_HEADER)
    link = tmp_path / "link.py"
    link.symlink_to("real.py")
    done = migrate(link)
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == "real.py"
    assert (tmp_path / "real.py").read_text() == CONVERTED


def test_hard_links_stay_linked_and_mode_is_kept(tmp_path):
    first, second = tmp_path / "train.py", tmp_path / "copy_of_train.txt"
    first.write_text(FSDP1_HEADER)
    os.link(first, second)
    first.chmod(0o640)
    done = migrate(first)
    assert done.returncode == 0, done.stderr
    assert os.path.samefile(first, second) and second.read_text() == CONVERTED
    assert first.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_the_owner_is_kept(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(FSDP1_HEADER)
    os.chown(path, 4321, 4322)
    done = migrate(path)
    assert done.returncode == 0, done.stderr
    assert (path.stat().st_uid, path.stat().st_gid) == (4321, 4322) and path.read_text() == CONVERTED


def test_an_unreadable_file_is_one_finding_and_the_run_goes_on(tmp_path, monkeypatch):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(FSDP1_HEADER)
    read_bytes = Path.read_bytes

    def failing(self):
        if self.name == "a.py":
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", failing)
    result, summary = run_here(tmp_path, monkeypatch, ".")
    assert [str(d) for d in result.diagnostics] == ["a.py:1:1: MF006 cannot read: Permission denied; file skipped"]
    assert (tmp_path / "b.py").read_text() == CONVERTED
    assert summary == "Rewrote 1 file (2 scanned); 1 FSDP1 use not converted (MF006: 1)."


def test_a_failed_write_is_a_finding_naming_the_file_and_the_run_goes_on(tmp_path, monkeypatch):
    (tmp_path / "locked").mkdir()
    for name in ("a.py", "locked/b.py", "z.py"):
        (tmp_path / name).write_text(FSDP1_HEADER)
    mkstemp = tempfile.mkstemp

    def read_only_dir(*args, dir=None, **kwargs):  # a read-only directory, also for root
        if Path(dir).name == "locked":
            raise PermissionError(13, "Permission denied", os.path.join(dir, ".b.py.1-x.migrate-fsdp.tmp"))
        return mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only_dir)
    result, summary = run_here(tmp_path, monkeypatch, ".")
    assert [str(d) for d in result.diagnostics] == [
        "locked/b.py:1:1: MF006 cannot write: Permission denied; file left unchanged"
    ]
    assert (tmp_path / "a.py").read_text() == (tmp_path / "z.py").read_text() == CONVERTED
    assert (tmp_path / "locked" / "b.py").read_text() == FSDP1_HEADER
    assert summary == "Rewrote 2 files (3 scanned); 1 FSDP1 use not converted (MF006: 1)."


def test_stale_temporaries_of_killed_runs_are_removed_on_the_next_write(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    stale = tmp_path / f".train.py.{child.pid}-abc_12xy.migrate-fsdp.tmp"
    live = tmp_path / f".train.py.{os.getpid()}-abc_12xy.migrate-fsdp.tmp"
    stale.write_text("half")
    live.write_text("a run still going")
    (tmp_path / "train.py").write_text(FSDP1_HEADER)
    done = migrate(tmp_path)
    assert done.returncode == 0, done.stderr
    assert not stale.exists() and live.exists()


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bug_in_joining_the_program_leaves_every_file_unchanged(tmp_path, monkeypatch, jobs):
    import migrate_fsdp.rewrite.api as api

    def broken(*args):
        raise IndexError("list index out of range")

    monkeypatch.setattr(api, "decide", broken)  # both one process and workers join the facts through api
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(FSDP1_HEADER)
    monkeypatch.chdir(tmp_path)
    result = run(["."], Selection.from_prefixes(None, None), exclude=[], jobs=jobs, todo=True, write=True)
    assert not result.changed
    assert [(d.path, d.code) for d in result.diagnostics] == [("a.py", "MF002"), ("b.py", "MF002")]
    assert all((tmp_path / name).read_text() == FSDP1_HEADER for name in ("a.py", "b.py"))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bug_in_one_file_leaves_its_whole_program_unchanged(tmp_path, monkeypatch, jobs):
    """fms-fsdp's shape, where a bug of ours stopped the checkpointing module: the training scripts converted, and
    the module left FSDP1 would have met their FSDP2 models. Every file of the program stays as it was."""
    from migrate_fsdp.rewrite.rules.training import no_sync

    converting = no_sync.NoSync.leave_Call

    def broken(self, original, updated):
        if self.ctx.path.endswith("steps.py"):
            raise RuntimeError("boom")
        return converting(self, original, updated)

    monkeypatch.setattr(no_sync.NoSync, "leave_Call", broken)
    (tmp_path / "steps.py").write_text(
        "def step(model, batch):\n    with model.no_sync():\n        model(batch).sum().backward()\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\nfrom steps import step\n\n"
        "model = FSDP(torch.nn.Linear(2, 2))\nstep(model, torch.ones(1, 2))\n"
    )
    before = {name: (tmp_path / name).read_text() for name in ("steps.py", "train.py")}
    monkeypatch.chdir(tmp_path)
    result = run(["."], Selection.from_prefixes(None, None), exclude=[], jobs=jobs, todo=True, write=True)
    assert not result.changed
    assert [(d.path, d.code) for d in result.diagnostics] == [("steps.py", "MF002"), ("train.py", "MF002")]
    assert "left unchanged with the rest of its program: an internal error in steps.py" in result.diagnostics[1].message
    assert {name: (tmp_path / name).read_text() for name in before} == before
