"""Bad invocations: one line on stderr, exit 2, before anything is launched."""

import pytest

from tests.verify.helpers import TRAIN, verify

OLD = TRAIN / "full_shard" / "fsdp1.py"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--new", OLD], "--new, --project and script arguments need OLD.py"),
        (["--", "--lr", "1"], "--new, --project and script arguments need OLD.py"),
        ([OLD, "--fixture", "full_shard"], "--fixture and --hand-written apply to the fixture suite"),
        (["missing.py"], "missing.py: no such file"),
        ([OLD, "--new", "missing.py"], "missing.py: no such file"),
        ([OLD, "--new", OLD, "--report", "no/such/dir/r.json"], "no/such/dir/r.json: its directory does not exist"),
        (["--fixture", "nope"], "no fixture named nope; known: "),
        (["--project", TRAIN], "--new, --project and script arguments need OLD.py"),
        ([OLD, "--new", TRAIN], f"--new {TRAIN}: no fsdp1.py in it (OLD.py's place in its project"),
        ([OLD, "--project", TRAIN / "no_shard"], "fsdp1.py is not inside it"),
        ([OLD.parent], "full_shard: not a file"),
        # Unwritable places are refused before the runs, not after minutes of training.
        ([OLD, "--new", OLD, "--report", "/proc/r.json"], "/proc/r.json: cannot write there"),
        ([OLD, "--new", OLD, "--plot", "/proc/p.png"], "/proc/p.png: cannot write there"),
        ([OLD, "--new", OLD, "--logs", "/proc/verify-logs"], "/proc/verify-logs: cannot write there"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    done = verify(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("migrate-fsdp verify: error: ") and message in lines[0]


def test_usage_errors_are_clicks_exit_2():
    done = verify("--steps", "0")
    assert done.returncode == 2 and "Invalid value for '--steps'" in done.stderr


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from click.testing import CliRunner; from migrate_fsdp.cli import main; "
            "r = CliRunner().invoke(main, ['verify', '--help']); assert r.exit_code == 0, r.output; "
            "assert '--rdzv-endpoint' in r.output; assert 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_plot_without_matplotlib_is_refused_before_anything_runs(tmp_path, monkeypatch):
    import importlib.util

    from click.testing import CliRunner

    from migrate_fsdp.verify.command import verify as command

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    done = CliRunner().invoke(command, [str(OLD), "--new", str(OLD), "--device", "cpu", "--plot", str(tmp_path / "p.png"),
                                        "--report", str(tmp_path / "r.json")])
    assert done.exit_code == 2
    assert done.output.strip() == "migrate-fsdp verify: error: --plot needs matplotlib: pip install 'migrate-fsdp[plot]'"
    assert not (tmp_path / "r.json").exists()
