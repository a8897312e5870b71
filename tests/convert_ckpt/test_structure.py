"""Finding the model, the optimizer and the extras in the layouts real checkpoints use, and writing each layout."""

import pickle

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from tests.convert_ckpt.helpers import cli, dcp_load, full_checkpoint, same, trained_net


def test_keep_layout_with_synonym_keys(saved, tmp_path):
    source = full_checkpoint()
    source = {"state_dict": source["model"], "optim": source["optimizer"], "epoch": 5}
    result = cli(saved(source), tmp_path / "dcp")
    assert result.exit_code == 0, result.output
    assert same(source, dcp_load(tmp_path / "dcp", source)) == []
    assert 'state = {"state_dict": model_state, "optim": optim_state}' in result.stdout
    assert "# also saved: epoch" in result.stdout


def test_bare_model_state_dict_from_ddp_and_compile(saved, tmp_path):
    model, _ = trained_net()
    wrapped = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    result = cli(saved(wrapped), tmp_path / "dcp")
    assert result.exit_code == 0, result.output
    clean = model.state_dict()
    assert same(dict(clean), dcp_load(tmp_path / "dcp", dict(clean))) == []
    assert "dcp.load(model_state, checkpoint_id=" in result.stdout


def test_optimizer_only_file(saved, tmp_path):
    optimizer_state = full_checkpoint()["optimizer"]  # what Accelerate writes to optimizer.bin
    assert cli(saved(optimizer_state), tmp_path / "dcp", "--verify").exit_code == 0
    assert same(optimizer_state, dcp_load(tmp_path / "dcp", optimizer_state)) == []


def test_torchtitan_layout_and_back(saved, tmp_path):
    model, optimizer = trained_net()
    source = full_checkpoint(train_state={"step": 9})
    assert cli(saved(source), tmp_path / "tt", "--layout", "torchtitan", "--verify").exit_code == 0
    flat_optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True))
    expected = {**model.state_dict(), "optimizer": flat_optim, "train_state": {"step": 9}}
    assert same(expected, dcp_load(tmp_path / "tt", expected)) == []

    # a torchtitan checkpoint read back: model at the top, flattened optimizer, made nested again
    result = cli(tmp_path / "tt", tmp_path / "acc", "--layout", "accelerate", "--to", "torch", "--verify")
    assert result.exit_code == 0, result.output
    assert same(dict(source["model"]), torch.load(tmp_path / "acc" / "pytorch_model_fsdp.bin", weights_only=True)) == []
    assert same(source["optimizer"], torch.load(tmp_path / "acc" / "optimizer.bin", weights_only=True)) == []
    assert torch.load(tmp_path / "acc" / "extra_state.pt", weights_only=True) == {"train_state": {"step": 9}}


def test_accelerate_dcp_layout(saved, tmp_path):
    source = full_checkpoint(epoch=1)
    result = cli(saved(source), tmp_path / "acc", "--layout", "accelerate")
    assert result.exit_code == 0, result.output
    model = {"model": dict(source["model"])}
    optimizer = {"optimizer": source["optimizer"]}
    assert same(model, dcp_load(tmp_path / "acc" / "pytorch_model_fsdp_0", model)) == []
    assert same(optimizer, dcp_load(tmp_path / "acc" / "optimizer_0", optimizer)) == []
    assert torch.load(tmp_path / "acc" / "extra_state.pt", weights_only=True) == {"epoch": 1}


def test_only_model(saved, tmp_path):
    source = full_checkpoint(epoch=1)
    assert cli(saved(source), tmp_path / "dcp", "--only", "model").exit_code == 0
    model_only = {"model": source["model"]}
    assert same(model_only, dcp_load(tmp_path / "dcp", model_only)) == []
    keys = pickle.loads((tmp_path / "dcp" / ".metadata").read_bytes()).state_dict_metadata
    assert keys and all(key.startswith("model.") for key in keys)


def test_model_and_optim_keys_for_unusual_files(saved, tmp_path):
    source = full_checkpoint()
    unusual = {"ckpt": {"net": {f"_orig_mod.{k}": v for k, v in source["model"].items()}, "opt": source["optimizer"]}}
    src = saved(unusual)
    result = cli(src, tmp_path / "plain", "--only", "model")
    assert result.exit_code == 2 and "--model-key" in result.stderr
    result = cli(src, tmp_path / "dcp", "--model-key", "ckpt.net", "--optim-key", "ckpt.opt", "--layout", "torchtitan")
    assert result.exit_code == 0, result.output
    model, optimizer = trained_net()
    expected = {
        **model.state_dict(),
        "optimizer": get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(flatten_optimizer_state_dict=True)
        ),
    }
    assert same(expected, dcp_load(tmp_path / "dcp", expected)) == []
    assert cli(src, tmp_path / "x", "--model-key", "ckpt.nothing").exit_code == 2


def test_prefixes_are_stripped_in_model_and_optimizer(saved, tmp_path):
    weight = torch.ones(2, 2)
    source = {
        "model": {
            "module.layers.0._checkpoint_wrapped_module.attn.weight": weight,
            "module._fsdp_wrapped_module.encoder.module.weight": weight * 2,  # a user's submodule named "module"
        },
        "optimizer": {
            "state": {"module.layers.0._checkpoint_wrapped_module.attn.weight": {"step": torch.tensor(1.0)}},
            "param_groups": [
                {
                    "lr": 0.1,
                    "params": [
                        "module.layers.0._checkpoint_wrapped_module.attn.weight",
                        "module._fsdp_wrapped_module.encoder.module.weight",
                    ],
                }
            ],
        },
    }
    src = saved(source)
    assert cli(src, tmp_path / "dcp").exit_code == 0
    expected = {
        "model": {"layers.0.attn.weight": weight, "encoder.module.weight": weight * 2},
        "optimizer": {
            "state": {"layers.0.attn.weight": {"step": torch.tensor(1.0)}},
            "param_groups": [{"lr": 0.1, "params": ["layers.0.attn.weight", "encoder.module.weight"]}],
        },
    }
    assert same(expected, dcp_load(tmp_path / "dcp", expected)) == []

    assert cli(src, tmp_path / "kept", "--keep-prefixes").exit_code == 0
    assert same(source, dcp_load(tmp_path / "kept", source)) == []

    assert (
        cli(src, tmp_path / "renamed", "--rename", r"^layers\.(\d+)=blocks.\1", "--rename", "attn=attention").exit_code
        == 0
    )
    renamed = dcp_load(
        tmp_path / "renamed", {"model": {"blocks.0.attention.weight": weight, "encoder.module.weight": weight}}
    )
    assert renamed["model"]["blocks.0.attention.weight"].equal(weight)


@pytest.mark.parametrize(
    ("rename", "message"),
    [
        ("weight=w", None),
        ("^.*$=same", "both become 'same'"),
        ("(unclosed=x", "bad regular expression"),
        ("noequals", "REGEX="),
    ],
)
def test_rename_errors(saved, tmp_path, rename, message):
    src = saved({"model": {"a.weight": torch.ones(1), "b.weight": torch.ones(1)}})
    result = cli(src, tmp_path / "dcp", "--rename", rename)
    if message is None:
        assert result.exit_code == 0
        return
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "dcp").exists()
