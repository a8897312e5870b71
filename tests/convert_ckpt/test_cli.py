"""The command line: exit codes, one-line errors, progress and summary, and no torch import where none is needed."""

import subprocess
import sys

import pytest
import torch

from migrate_fsdp.convert_ckpt import convert
from tests.convert_ckpt.helpers import cli, cli_process, full_checkpoint

RUN_WITHOUT_TORCH = """
import sys
from click.testing import CliRunner
from migrate_fsdp.convert_ckpt.command import convert_ckpt
result = CliRunner().invoke(convert_ckpt, sys.argv[1:])
print(result.exit_code, "torch" in sys.modules)
"""


def test_conversion_and_help_do_not_import_torch(saved, tmp_path):
    src = saved(full_checkpoint(epoch=1))
    for args in (
        ["--help"],
        [str(src), str(tmp_path / "dcp"), "--to", "dcp"],
        [str(tmp_path / "dcp"), str(tmp_path / "b.pt"), "--to", "torch"],
    ):
        done = subprocess.run(
            [sys.executable, "-c", RUN_WITHOUT_TORCH, *args], capture_output=True, text=True, timeout=60
        )
        assert done.stdout.split() == ["0", "False"], (args, done.stdout, done.stderr)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Missing argument"),
        (["a.pt", "b", "--to", "onnx"], "Invalid value"),
        (["a.pt", "b", "--shards", "x"], "Invalid value"),
        (["a.pt", "b", "--max-shard-size", "lots"], "not a size"),
    ],
)
def test_usage_errors_exit_2(args, message):
    done = cli_process(*args)
    assert done.returncode == 2 and message in done.stderr


def test_bad_paths(saved, tmp_path):
    src = saved(full_checkpoint())
    for args, message in [
        ((tmp_path / "none.pt", tmp_path / "dcp"), "does not exist"),
        ((src, src), "DST is SRC"),
        ((src, tmp_path / "no" / "dir" / "dcp"), "does not exist"),
    ]:
        done = cli_process(*args)
        assert done.returncode == 2 and message in done.stderr
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_internal_errors_are_one_line(saved, tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(convert, "read_source", broken)
    result = cli(saved(full_checkpoint()), tmp_path / "dcp")
    assert result.exit_code == 2
    assert result.stderr == "migrate-fsdp convert-ckpt: error: internal error: RuntimeError: boom second line\n"


def test_progress_summary_and_snippet(saved, tmp_path):
    src = saved({"model": {"w": torch.ones(1000, 1000)}})
    result = cli(src, tmp_path / "dcp", "--progress")
    assert result.exit_code == 0
    assert "\r[##############################] 4.00 MB / 4.00 MB 100% " in result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"converted {src} (torch) -> {tmp_path / 'dcp'} (dcp, layout keep): 1 tensors, 4.00 MB in ")
    assert "set_model_state_dict(model, model_state)" in result.stdout
    assert cli(src, tmp_path / "quiet", "-q").stdout == ""


def test_no_snippet_without_a_model_or_optimizer(saved, tmp_path):
    src = saved({"ema": {"shadow": {"w": torch.ones(2)}}, "step": 3})
    result = cli(src, tmp_path / "dcp")
    assert result.exit_code == 0
    assert "--model-key" in result.stderr
    assert "dcp.load" not in result.stdout and "import" not in result.stdout
