"""Every format pair converts bit-exactly, and torch's own readers read what convert-ckpt writes."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.convert_ckpt.helpers import cli, dcp_load, full_checkpoint, rich_extras, same, trained_net

ALL_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def odd_tensors():
    """Tensors torch.save stores in every way it can: all dtypes, views, shared storage, 0-d, empty."""
    torch.manual_seed(1)
    base = torch.randn(6, 8)
    tensors = {f"dtype.{str(d).removeprefix('torch.')}": (torch.randn(3, 5) * 100).to(d) for d in ALL_DTYPES}
    tensors.update(
        {
            "view.transposed": base.t(),
            "view.strided": base[:, ::3],
            "view.offset": base[2:],
            "view.expanded": torch.arange(3.0).expand(4, 3),
            "tied.a": base,
            "tied.b": base,
            "scalar": torch.tensor(7.5),
            "empty": torch.empty(0, 4),
        }
    )
    return tensors


def test_torch_to_dcp_loads_with_dcp_load_and_keeps_extras(saved, tmp_path):
    source = full_checkpoint(**rich_extras())
    result = cli(saved(source), tmp_path / "dcp", "--verify")
    assert result.exit_code == 0, result.output
    assert "verified bit-exact" in result.stdout
    assert same(source, dcp_load(tmp_path / "dcp", source)) == []


def test_metadata_is_what_dcp_save_writes(saved, tmp_path):
    import torch.distributed.checkpoint as dcp

    source = full_checkpoint(**rich_extras())
    assert cli(saved(source), tmp_path / "ours").exit_code == 0
    dcp.save(source, checkpoint_id=str(tmp_path / "theirs"), no_dist=True)
    ours, theirs = (pickle.loads((tmp_path / d / ".metadata").read_bytes()) for d in ("ours", "theirs"))
    assert ours.state_dict_metadata == theirs.state_dict_metadata
    assert ours.planner_data == theirs.planner_data
    assert set(ours.storage_data) == set(theirs.storage_data)
    assert ours.version == theirs.version


def test_dcp_to_torch_save_reads_our_dcp(saved, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    source = full_checkpoint(epoch=2)
    assert cli(saved(source), tmp_path / "dcp").exit_code == 0
    dcp_to_torch_save(tmp_path / "dcp", tmp_path / "back.pt")
    assert same(source, torch.load(tmp_path / "back.pt", weights_only=True)) == []


@pytest.mark.parametrize("to", ["dcp", "torch"])
def test_every_dtype_and_view_round_trips(saved, tmp_path, to):
    source = odd_tensors()
    dst = tmp_path / "out"
    result = cli(saved(source), dst, "--to", to, "--verify")
    assert result.exit_code == 0, result.output
    if to == "dcp":
        assert same(source, dcp_load(dst, source)) == []
    else:
        assert same(source, torch.load(dst, weights_only=True)) == []
        assert same(source, torch.load(dst, weights_only=True, mmap=True)) == []
        loaded = torch.load(dst, weights_only=True)
        assert loaded["tied.a"].untyped_storage().data_ptr() == loaded["tied.b"].untyped_storage().data_ptr()


def test_torch_round_trip_keeps_containers(saved, tmp_path):
    model, _ = trained_net()
    source = {"model": model.state_dict(), "epoch": 1}
    assert cli(saved(source), tmp_path / "out.pt", "--to", "torch").exit_code == 0
    loaded = torch.load(tmp_path / "out.pt", weights_only=True)
    assert type(loaded["model"]) is type(source["model"])
    assert loaded["model"]._metadata == source["model"]._metadata  # module versions nn.Module.load_state_dict uses
    assert same(source, loaded) == []


@pytest.mark.parametrize("extras", [{"epoch": 1}, rich_extras()], ids=["plain", "numpy-namespace-path"])
def test_legacy_torch_save_file(saved, tmp_path, extras):
    source = full_checkpoint(**extras)
    path = tmp_path / "legacy.pt"
    torch.save(source, path, _use_new_zipfile_serialization=False)
    assert cli(path, tmp_path / "dcp", "--verify").exit_code == 0
    assert same(source, dcp_load(tmp_path / "dcp", source)) == []


def test_safetensors_file_and_shards(saved, tmp_path):
    model = {k: v for k, v in odd_tensors().items() if not k.startswith("dtype.complex128") and k != "view.expanded"}
    model = {k: v for k, v in model.items() if not k.startswith("tied.b")}
    src = saved(model)
    assert cli(src, tmp_path / "one.safetensors", "--to", "safetensors", "--verify").exit_code == 0
    assert same(model, load_file(tmp_path / "one.safetensors")) == []

    result = cli(src, tmp_path / "sharded", "--to", "safetensors", "--max-shard-size", "300B", "--verify")
    assert result.exit_code == 0, result.output
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1
    loaded = {}
    for name in files:
        loaded.update(load_file(tmp_path / "sharded" / name))
    assert same(model, loaded) == []


def test_safetensors_and_hf_index_to_dcp_and_back(tmp_path):
    torch.manual_seed(0)
    model = {"a.weight": torch.randn(4, 3), "b.weight": torch.randn(5).to(torch.bfloat16), "c": torch.arange(6)}
    save_file({"a.weight": model["a.weight"]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({"b.weight": model["b.weight"], "c": model["c"]}, tmp_path / "model-00002-of-00002.safetensors")
    weight_map = {
        "a.weight": "model-00001-of-00002.safetensors",
        "b.weight": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors",
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    assert cli(tmp_path, tmp_path.parent / f"{tmp_path.name}-dcp", "--verify").exit_code == 0
    dcp_dir = tmp_path.parent / f"{tmp_path.name}-dcp"
    assert same(model, dcp_load(dcp_dir, model)) == []

    back = tmp_path.parent / f"{tmp_path.name}-back.safetensors"
    assert cli(dcp_dir, back, "--to", "safetensors", "--verify").exit_code == 0
    assert same(model, load_file(back)) == []


def test_dcp_to_torch_reassembles_sharded_dcp(saved, tmp_path):
    source = full_checkpoint(epoch=4)
    assert cli(saved(source), tmp_path / "dcp", "--shards", "3").exit_code == 0
    result = cli(tmp_path / "dcp", tmp_path / "full.pt", "--to", "torch", "--verify")
    assert result.exit_code == 0, result.output
    assert same(source, torch.load(tmp_path / "full.pt", weights_only=True)) == []
