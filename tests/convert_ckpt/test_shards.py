"""`--shards N`: DCP pre-split along dim 0 exactly where FSDP2 splits, so each rank reads only its own chunk."""

import json
import subprocess
import sys

import pytest
import torch
from torch.distributed.tensor import Shard

from migrate_fsdp.convert_ckpt.write_dcp import fsdp2_row_chunks
from tests.convert_ckpt.helpers import cli, same
from tests.support import FIXTURES, torchrun

SCRIPT = FIXTURES / "ckpt" / "sharded_load.py"


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 8, 9, 16, 1001])
def test_chunks_are_fsdp2s(rows, shards):
    ours = fsdp2_row_chunks(rows, shards)
    chunks = torch.chunk(torch.arange(rows), shards)  # FSDP2's _chunk_with_empty, before padding
    assert ours == [(int(c[0]), int(c[-1]) + 1) for c in chunks]
    dtensor = [Shard.local_shard_size_and_offset(rows, shards, rank) for rank in range(shards)]
    assert ours == [(offset, offset + size) for size, offset in dtensor if size]


@pytest.mark.slow
def test_each_rank_reads_its_half_and_loads_bit_exact(tmp_path):
    source_path = tmp_path / "full.pt"
    subprocess.run([sys.executable, str(SCRIPT), "make", str(source_path)], check=True, timeout=120)
    result = cli(source_path, tmp_path / "dcp", "--shards", 2, "--verify")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    torchrun(SCRIPT, "load", tmp_path / "dcp", tmp_path / "report")
    report = json.loads((tmp_path / "report.json").read_text())
    tensor_bytes, reads = report["tensor_bytes"], report["bytes_read"]
    assert sum(reads) >= tensor_bytes  # every tensor byte was read by some rank (the counter sees the reads)
    assert all(count < 0.6 * tensor_bytes for count in reads)  # and each rank read only about its half
    source = torch.load(source_path, weights_only=True)
    loaded = torch.load(tmp_path / "report.pt", weights_only=True)
    assert same(dict(source["model"]), loaded["model"]) == []
    assert same(source["optimizer"], loaded["optimizer"]) == []


def test_shards_need_dcp(saved, tmp_path):
    result = cli(saved({"w": torch.ones(4)}), tmp_path / "out.pt", "--to", "torch", "--shards", "2")
    assert result.exit_code == 2 and "--to dcp" in result.stderr
