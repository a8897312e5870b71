"""Inputs that are not FULL_STATE_DICT checkpoints are refused with one line that names what to do instead.

The FSDP1 variants are generated for real, by FSDP1 on 2 gloo ranks (fixtures/ckpt/fsdp1_variants.py).
"""

import json
import pickle
import struct

import pytest
import torch
import torch.nn as nn
from safetensors.torch import save_file

from tests.convert_ckpt.helpers import cli, cli_process, full_checkpoint
from tests.support import FIXTURES, torchrun


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp1_variants")
    torchrun(FIXTURES / "ckpt" / "fsdp1_variants.py", out)
    return out


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("local_rank0", "LOCAL_STATE_DICT"),
        ("local_rank1", "LOCAL_STATE_DICT"),
        ("sharded_rank0", "SHARDED_STATE_DICT"),
        ("raw_optim_rank0", "raw optimizer.state_dict()"),
        ("raw_optim_rank1", "raw optimizer.state_dict()"),
        ("full_rank1", "rank0_only=True"),
        ("dtensor_rank0", "DTensor"),
    ],
)
@pytest.mark.slow
def test_fsdp_checkpoints_that_are_not_full(variants, tmp_path, name, expected):
    done = cli_process(variants / f"{name}.pt", tmp_path / "dcp")
    assert done.returncode == 2
    assert expected in done.stderr
    assert done.stderr.startswith("migrate-fsdp convert-ckpt: error: ") and done.stderr.count("\n") == 1
    assert not (tmp_path / "dcp").exists()


@pytest.mark.slow
def test_the_full_checkpoint_of_the_same_run_converts(variants, tmp_path):
    result = cli(variants / "full_rank0.pt", tmp_path / "dcp", "--verify")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ([torch.ones(2)], "holds a list"),
        (torch.ones(2), "holds a tensor"),
        ({"epoch": 3}, "holds no tensors"),
        ({"model": {}, "optimizer": {}}, "holds no tensors"),
        ({"model": {}, "optimizer": {}, "epoch": 1, "rng": torch.get_rng_state()}, "holds no tensors under 'model'"),
        ({"state_dict": {}, "rng": torch.get_rng_state()}, "rank0_only=True"),
        ({"model": {"w": torch.ones(2)}, "optimizer": {}, "rng": torch.get_rng_state()}, "under 'optimizer'"),
    ],
)
def test_non_dict_and_empty_pickles(saved, tmp_path, obj, expected):
    result = cli(saved(obj), tmp_path / "dcp")
    assert result.exit_code == 2 and expected in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "dcp").exists()


@pytest.mark.parametrize("keep", [0.5, 0.99])
@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_truncated_torch_file(tmp_path, keep, legacy):
    path = tmp_path / "ckpt.pt"
    torch.save(full_checkpoint(), path, _use_new_zipfile_serialization=not legacy)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    done = cli_process(path, tmp_path / "dcp")
    assert done.returncode == 2 and "truncated" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr and "internal error" not in done.stderr


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_a_pickled_module_is_not_a_state_dict(tmp_path, legacy):
    path = tmp_path / "model.pt"
    torch.save(nn.Sequential(nn.Linear(2, 2)), path, _use_new_zipfile_serialization=not legacy)
    result = cli(path, tmp_path / "dcp")
    assert result.exit_code == 2
    assert "torch.nn.modules.container.Sequential" in result.stderr and "save model.state_dict()" in result.stderr


def test_truncated_safetensors(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.ones(100, 100)}, path)
    path.write_bytes(path.read_bytes()[:-100])
    result = cli(path, tmp_path / "dcp")
    assert result.exit_code == 2 and "truncated" in result.stderr


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ({"w": {"dtype": "F32", "shape": [4]}}, "'w' is not a dtype, shape and data_offsets"),
        ({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}}, "'w' is not a dtype, shape and data_offsets"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "n": 3}, "'n' is not a dtype"),
        ({"w": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}}, "tensor w has bytes 0..16 for shape [5]"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, "tensor w has bytes 16..0"),
    ],
)
def test_corrupt_safetensors_header(tmp_path, header, expected):
    path = tmp_path / "model.safetensors"
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + bytes(32))
    result = cli(path, tmp_path / "dcp")
    assert result.exit_code == 2 and expected in result.stderr and str(path) in result.stderr
    assert "internal error" not in result.stderr


@pytest.mark.parametrize(
    ("weight_map", "expected"),
    [(["w"], "does not map tensor names to shard files"), ({"w": "../elsewhere.safetensors"}, "outside its directory")],
)
def test_bad_safetensors_index(tmp_path, weight_map, expected):
    save_file({"w": torch.ones(2)}, tmp_path / "elsewhere.safetensors")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    result = cli(tmp_path / "hf", tmp_path / "dcp")
    assert result.exit_code == 2 and expected in result.stderr


def test_dcp_with_truncated_metadata(saved, tmp_path):
    assert cli(saved(full_checkpoint()), tmp_path / "dcp").exit_code == 0
    metadata = tmp_path / "dcp" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:100])
    result = cli(tmp_path / "dcp", tmp_path / "full.pt", "--to", "torch")
    assert result.exit_code == 2 and f"{metadata} is truncated or corrupt" in result.stderr


def test_dcp_with_a_missing_data_file(saved, tmp_path):
    assert cli(saved(full_checkpoint()), tmp_path / "dcp").exit_code == 0
    (tmp_path / "dcp" / "__0_0.distcp").unlink()
    result = cli(tmp_path / "dcp", tmp_path / "full.pt", "--to", "torch")
    assert result.exit_code == 2 and "missing" in result.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"", "is empty"), (pickle.dumps({"w": 1}), "plain pickle"), (b"hello world", "not a checkpoint")],
)
def test_files_that_are_not_checkpoints(tmp_path, content, expected):
    path = tmp_path / "input.pt"
    path.write_bytes(content)
    result = cli(path, tmp_path / "dcp")
    assert result.exit_code == 2 and expected in result.stderr
