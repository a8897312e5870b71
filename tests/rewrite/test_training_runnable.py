"""Runnable proof for the training-loop rules (MF2xx): the rewrite trains, checkpoints and resumes like FSDP1.

fixtures/train/loop_and_checkpoint/fsdp1.py accumulates gradients under
no_sync() in its nested, stored-method and ExitStack forms, clips with the
norm printed, takes full model and optimizer state dicts in two settings,
writes them, resumes a fresh model from them and trains on (twice: the optimizer state loaded at once,
then converted on the FSDP path only and loaded after it). Its rewrite runs
next to it on 2 gloo ranks (one launch each) and must give the same losses,
the same gradient norms up to rounding, and checkpoint files with the same
keys and bit-identical tensors.
"""

import math
import re

import numpy as np
import pytest
import torch

from migrate_fsdp.rewrite.api import rewrite_source
from tests.support import FIXTURES, step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

SCRIPT = FIXTURES / "train" / "loop_and_checkpoint" / "fsdp1.py"
CHECKPOINTS = ("rank0.0.pt", "rank0.1.pt", "all.0.pt", "all.1.pt")
# FSDP1 sums the squared gradients over its flat-parameter shards, DTensor per parameter shard: the
# same terms, associated differently. Blocked float32 sums of n <= 2**16 terms can then differ by
# about log2(n) rounding steps, so the two global norms must agree to 16 ulp (they differ by 1-3 here).
NORM_ULPS = 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("loop_and_checkpoint")
    result = rewrite_source(SCRIPT.read_bytes(), str(SCRIPT))
    rewritten = work / "rewritten.py"
    rewritten.write_bytes(result.new_source)
    outputs = {}
    for side, script in (("old", SCRIPT), ("new", rewritten)):
        (work / side).mkdir()
        stdout = torchrun(script, "--save", work / side).stdout
        outputs[side] = step_lines(stdout)
        outputs[f"{side} summary"] = [line for line in stdout.splitlines() if line.startswith(("units ", "params "))]
    return result, work, outputs


def _fields(line: str) -> dict:
    return dict(re.findall(r"(\w+) (\S+)", line))


def test_the_rewrite_converts_everything(runs):
    result, _, _ = runs
    assert result.diagnostics == []
    assert "torch.distributed.fsdp import FullyShardedDataParallel" not in result.code
    assert "migrate_fsdp" not in result.code


def test_same_losses_every_step(runs):
    _, _, outputs = runs
    old, new = outputs["old"], outputs["new"]
    assert len(old) == len(new) == 8
    assert [_fields(line)["loss"] for line in old] == [_fields(line)["loss"] for line in new]


def test_same_units_and_full_parameters(runs):
    """`FSDP.fsdp_modules` counts the same units; the summon_full_params read sees the same values."""
    _, _, outputs = runs
    assert len(outputs["old summary"]) == 2
    assert outputs["old summary"] == outputs["new summary"]


def test_gradient_norms_agree_to_rounding(runs):
    _, _, outputs = runs
    for old_line, new_line in zip(outputs["old"], outputs["new"], strict=True):
        old, new = float(_fields(old_line)["norm"]), float(_fields(new_line)["norm"])
        ulp = float(np.spacing(np.float32(max(old, new))))
        assert math.isfinite(new) and abs(old - new) <= NORM_ULPS * ulp, (old_line, new_line)


def test_checkpoints_have_the_same_keys_and_tensors(runs):
    _, work, _ = runs
    for name in CHECKPOINTS:
        old = _flatten(torch.load(work / "old" / name, weights_only=True))
        new = _flatten(torch.load(work / "new" / name, weights_only=True))
        assert old.keys() == new.keys(), name
        for key, value in old.items():
            other = new[key]
            if isinstance(value, torch.Tensor):
                assert isinstance(other, torch.Tensor), (name, key)
                assert (value.dtype, value.shape, value.device) == (other.dtype, other.shape, other.device), (name, key)
                assert torch.equal(value, other), (name, key)
            else:
                assert value == other and type(value) is type(other), (name, key, value, other)


def test_rank0_only_checkpoints_are_empty_elsewhere(runs):
    _, work, _ = runs
    for side in ("old", "new"):
        assert torch.load(work / side / "rank0.1.pt", weights_only=True) == {"model": {}, "optim": {}}


def _flatten(value, prefix=""):
    """Leaves of a nested state dict by path. The parameter names in `param_groups` are compared as a
    set: each optimizer lists them in its own parameter order, which for FSDP1 is its flat-parameter order."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}/{key}").items()}
    if isinstance(value, list) and prefix.endswith("/params"):
        return {prefix: sorted(value)}
    if isinstance(value, (list, tuple)):
        return {k: v for index, item in enumerate(value) for k, v in _flatten(item, f"{prefix}[{index}]").items()}
    return {prefix: value}
