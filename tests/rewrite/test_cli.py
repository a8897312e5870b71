"""The `rewrite` command line: modes, exit codes, output formats, file handling.

These tests select only the catch-all code (MF900) so that they exercise the
engine and CLI independently of what the rules convert.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

LEFTOVER_ONLY = ["--select", "MF900"]

FSDP1_FILE = """\
import torch
from torch.distributed.fsdp import ShardingStrategy


def strategy():
    # keep this comment
    return ShardingStrategy.FULL_SHARD
"""

CLEAN_FILE = "import torch\n\nx = torch.zeros(1)\n"


def migrate(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
    )


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(FSDP1_FILE)
    (tmp_path / "pkg" / "clean.py").write_text(CLEAN_FILE)
    return tmp_path


def snapshot(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_clean_tree_exits_0_and_writes_nothing(tmp_path):
    (tmp_path / "clean.py").write_text(CLEAN_FILE)
    before = snapshot(tmp_path)
    done = migrate(tmp_path)
    assert done.returncode == 0, done.stderr
    assert snapshot(tmp_path) == before
    assert "Rewrote 0 files (1 scanned); nothing left unconverted." in done.stderr


def test_check_reports_and_writes_nothing(tree):
    before = snapshot(tree)
    done = migrate("--check", *LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    assert snapshot(tree) == before
    assert done.stdout.splitlines() == [
        "pkg/train.py:7:12: MF900 `ShardingStrategy.FULL_SHARD` (torch.distributed.fsdp.ShardingStrategy.FULL_SHARD) "
        "is FSDP1 API with no automatic FSDP2 rewrite here; see docs/mapping.md for its FSDP2 replacement"
    ]
    assert "Would rewrite 1 file (2 scanned); 1 FSDP1 use not converted (MF900: 1)." in done.stderr


def test_write_marks_leftovers_once_and_exits_1(tree):
    done = migrate(*LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    text = (tree / "pkg" / "train.py").read_text()
    assert text.count("# TODO(migrate-fsdp): MF900") == 1
    assert "    # keep this comment\n    # TODO(migrate-fsdp): MF900 FSDP1 API with no automatic rewrite\n" in text
    again = migrate(*LEFTOVER_ONLY, "pkg", cwd=tree)
    assert again.returncode == 1
    assert (tree / "pkg" / "train.py").read_text() == text
    assert not [p for p in tree.rglob("*") if p.name.endswith(".tmp")]


def test_no_todo_leaves_file_alone_but_still_reports(tree):
    before = snapshot(tree)
    done = migrate("--no-todo", *LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    assert snapshot(tree) == before
    assert "MF900" in done.stdout


def test_diff_is_plain_and_git_applies_it(tree):
    shutil.copytree(tree / "pkg", tree / "expected")
    migrate(*LEFTOVER_ONLY, "expected", cwd=tree)
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    before = snapshot(tree / "pkg")
    done = migrate("--diff", *LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    assert snapshot(tree / "pkg") == before
    assert "\x1b[" not in done.stdout
    assert done.stdout.startswith("--- a/pkg/train.py\n+++ b/pkg/train.py\n")
    assert "MF900" in done.stderr  # diagnostics go to stderr so stdout is only the patch
    subprocess.run(["git", "apply", "-"], input=done.stdout, text=True, cwd=tree, check=True)
    assert (tree / "pkg" / "train.py").read_bytes() == (tree / "expected" / "train.py").read_bytes()


def test_crlf_latin1_and_missing_final_newline_survive(tmp_path):
    source = FSDP1_FILE.replace("# keep this comment", "# coding: latin-1 caf\xe9").rstrip("\n")
    source = "# -*- coding: latin-1 -*-\n" + source
    data = source.replace("\n", "\r\n").encode("latin-1")
    path = tmp_path / "win.py"
    path.write_bytes(data)
    migrate(*LEFTOVER_ONLY, "win.py", cwd=tmp_path)
    out = path.read_bytes()
    assert out.count(b"\r\n") == out.count(b"\n")
    assert "caf\xe9".encode("latin-1") in out
    assert not out.endswith(b"\n")
    # the diff applies byte for byte too
    path.write_bytes(data)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    diff = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", "--diff", *LEFTOVER_ONLY, "win.py"],
        capture_output=True,
        cwd=tmp_path,
    )
    assert diff.returncode == 1
    assert path.read_bytes() == data
    subprocess.run(["git", "apply", "-"], input=diff.stdout, cwd=tmp_path, check=True)
    assert path.read_bytes() == out


def test_unparsable_file_is_reported_and_run_goes_on(tree):
    (tree / "pkg" / "broken.py").write_text("from torch.distributed.fsdp import FullyShardedDataParallel\ndef f(:\n")
    done = migrate(*LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pkg/broken.py:2:") and " MF001 cannot parse" in lines[0]
    assert lines[1].startswith("pkg/train.py:7:12: MF900")
    assert "# TODO(migrate-fsdp)" in (tree / "pkg" / "train.py").read_text()


def test_undecodable_file_is_reported_untouched_and_run_goes_on(tree):
    broken = b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n# caf\xe9\nm = FSDP(m)\n"
    (tree / "pkg" / "latin.py").write_bytes(broken)  # latin-1 bytes, no coding declaration
    done = migrate(*LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("pkg/latin.py:2:6: MF001 cannot decode as utf-8"), first
    assert (tree / "pkg" / "latin.py").read_bytes() == broken
    assert "# TODO(migrate-fsdp)" in (tree / "pkg" / "train.py").read_text()


def test_json_format(tree):
    done = migrate("--check", "--format", "json", *LEFTOVER_ONLY, "pkg", cwd=tree)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["mode"] == "check"
    assert report["summary"] == {"scanned": 2, "parsed": 1, "changed": 1, "diagnostics": 1, "by_code": {"MF900": 1}}
    assert report["diagnostics"][0]["path"] == "pkg/train.py"
    assert report["diagnostics"][0]["line"] == 7
    diff = json.loads(migrate("--diff", "--format", "json", *LEFTOVER_ONLY, "pkg", cwd=tree).stdout)
    assert diff["files"][0]["diff"].startswith("--- a/pkg/train.py")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--select", "XY9"], "unknown rule code or prefix 'XY9'"),
        (["does-not-exist"], "does-not-exist: no such file or directory"),
        ([], "give at least one PATH"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    done = migrate(*args, *(["."] if args and args[0] == "--select" else []), cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_ignore_drops_the_catch_all(tree):
    done = migrate("--check", "--ignore", "MF9", "pkg", cwd=tree)
    assert "MF900" not in done.stdout


def test_list_codes():
    done = migrate("--list-codes")
    assert done.returncode == 0
    codes = [line.split()[0] for line in done.stdout.splitlines()]
    assert codes == sorted(codes)
    assert {"MF001", "MF002", "MF900"} <= set(codes)


def test_skips_vcs_venv_build_generated_and_excluded(tree):
    for directory in [".git", "build", "venv_like", "node_modules", "x.egg-info"]:
        (tree / directory).mkdir()
        (tree / directory / "m.py").write_text(FSDP1_FILE)
    (tree / "venv_like" / "pyvenv.cfg").write_text("home = /usr\n")
    (tree / "gen.py").write_text("# " + "@" + "generated by a tool\n" + FSDP1_FILE)
    (tree / "skip_me.py").write_text(FSDP1_FILE)
    done = migrate("--check", *LEFTOVER_ONLY, "--exclude", "skip_*.py", ".", cwd=tree)
    paths = {line.split(":")[0] for line in done.stdout.splitlines()}
    assert paths == {"pkg/train.py"}


def test_a_package_named_like_a_build_dir_is_the_programs_own(tree):
    # `src/pkg/dist/`, a project's distributed code: skipped, its FSDP1 code would stay beside the converted rest
    for directory in ["dist", "build"]:
        (tree / "pkg" / directory).mkdir()
        (tree / "pkg" / directory / "__init__.py").write_text("")
        (tree / "pkg" / directory / "wrap.py").write_text(FSDP1_FILE)
    (tree / "dist").mkdir()
    (tree / "dist" / "m.py").write_text(FSDP1_FILE)
    done = migrate("--check", *LEFTOVER_ONLY, ".", cwd=tree)
    paths = {line.split(":")[0] for line in done.stdout.splitlines()}
    assert paths == {"pkg/train.py", "pkg/dist/wrap.py", "pkg/build/wrap.py"}


def test_explicit_file_is_taken_even_in_a_skipped_dir(tree):
    (tree / "build").mkdir()
    (tree / "build" / "m.py").write_text(FSDP1_FILE)
    done = migrate("--check", *LEFTOVER_ONLY, "build/m.py", cwd=tree)
    assert done.stdout.startswith("build/m.py:7:12: MF900")


def test_parallel_and_serial_agree(tmp_path):
    for i in range(6):
        (tmp_path / f"m{i}.py").write_text(FSDP1_FILE * (i + 1))
    serial = migrate("--check", "--jobs", "1", *LEFTOVER_ONLY, ".", cwd=tmp_path)
    parallel = migrate("--check", "--jobs", "2", *LEFTOVER_ONLY, ".", cwd=tmp_path)
    assert serial.stdout == parallel.stdout
    assert serial.stdout.splitlines() == sorted(serial.stdout.splitlines(), key=lambda l: (l.split(":")[0], int(l.split(":")[1])))


def test_write_keeps_file_mode(tree):
    path = tree / "pkg" / "train.py"
    os.chmod(path, 0o750)
    migrate(*LEFTOVER_ONLY, "pkg", cwd=tree)
    assert path.stat().st_mode & 0o777 == 0o750


def test_a_heads_up_on_converted_code_is_counted_apart_from_what_stays(tmp_path):
    """MF219 says LOCAL checkpoints an FSDP1 run wrote do not load: the model converted, nothing FSDP1 is left."""
    (tmp_path / "save.py").write_text(
        "import torch\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "from torch.distributed.fsdp import StateDictType\n\n\n"
        "def save(net, path):\n"
        "    model = FSDP(net, device_id=torch.device('cpu'))\n"
        "    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):\n"
        "        torch.save(model.state_dict(), path)\n"
    )
    done = migrate("--check", ".", cwd=tmp_path)
    assert "Would rewrite 1 file (1 scanned); nothing left unconverted; 1 heads-up on converted code (MF219: 1)." in done.stderr
