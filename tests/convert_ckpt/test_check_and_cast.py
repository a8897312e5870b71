"""`--check-against` lists every key problem before writing; `--dtype` casts the model and nothing else."""

import textwrap

import torch

from tests.convert_ckpt.helpers import cli, dcp_load, full_checkpoint, same

FACTORY = textwrap.dedent("""
    from tests.convert_ckpt.helpers import TinyNet
    import torch.nn as nn


    def build():
        return TinyNet()


    def build_renamed():
        model = TinyNet()
        model.output = model.head  # checkpoint has head.weight, this model output.weight
        del model.head
        model.extra = nn.Linear(2, 2)
        model.proj = nn.Linear(6, 4)  # 5 outputs in the checkpoint
        return model


    def build_nothing():
        return 42
    """)


def test_check_against_passes_and_writes(saved, tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    result = cli(saved(full_checkpoint()), tmp_path / "dcp", "--check-against", f"{tmp_path / 'factory.py'}:build")
    assert result.exit_code == 0, result.output


def test_check_against_lists_every_problem_and_writes_nothing(saved, tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    result = cli(
        saved(full_checkpoint()), tmp_path / "dcp", "--check-against", f"{tmp_path / 'factory.py'}:build_renamed"
    )
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    for expected in [
        "missing: output.weight",
        "missing: extra.weight",
        "missing: extra.bias",
        "unexpected: head.weight",
        "shape: proj.weight is [5, 6] in the checkpoint, [4, 6] in the model",
        "shape: proj.bias is [5] in the checkpoint, [4] in the model",
        "unexpected: optimizer state for head.weight",
    ]:
        assert any(line.startswith(expected) for line in lines), expected
    assert "nothing was written" in lines[-1]
    assert not (tmp_path / "dcp").exists()


def test_check_against_bad_factory(saved, tmp_path):
    (tmp_path / "factory.py").write_text(FACTORY)
    src = saved(full_checkpoint())
    for spec, message in [
        (f"{tmp_path / 'factory.py'}:build_nothing", "not an nn.Module"),
        (f"{tmp_path / 'factory.py'}:missing", "cannot load"),
        ("no_colon", "MODULE:FACTORY"),
    ]:
        result = cli(src, tmp_path / "dcp", "--check-against", spec)
        assert result.exit_code == 2 and message in result.stderr


def test_dtype_casts_model_floats_only(saved, tmp_path):
    source = full_checkpoint(epoch=1)
    result = cli(saved(source), tmp_path / "dcp", "--dtype", "bf16", "--verify")
    assert result.exit_code == 0, result.output
    expected = {
        **source,
        "model": {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in source["model"].items()},
    }
    loaded = dcp_load(tmp_path / "dcp", expected)
    assert same(expected, loaded) == []
    assert loaded["model"]["positions"].dtype == torch.int64
    assert loaded["optimizer"]["state"]["proj.weight"]["exp_avg"].dtype == torch.float32
