"""The hand-written FSDP1/FSDP2 name lists agree with the installed torch."""

import torch.distributed.fsdp as fsdp
import torch.distributed.fsdp.wrap as wrap

from migrate_fsdp.rewrite.names import FSDP1_EXPORTS, FSDP2_EXPORTS, WRAP_EXPORTS, canonical, is_fsdp1, may_use_fsdp1
from tests.support import FIXTURES


def test_package_exports_split_into_fsdp1_and_fsdp2():
    assert set(fsdp.__all__) == FSDP1_EXPORTS | FSDP2_EXPORTS
    assert not FSDP1_EXPORTS & FSDP2_EXPORTS


def test_fsdp2_exports_are_fsdp2():
    from torch.distributed.fsdp import _fully_shard

    for name in FSDP2_EXPORTS:
        assert not is_fsdp1(f"torch.distributed.fsdp.{name}"), name
        assert getattr(_fully_shard, name) is getattr(fsdp, name)
    for name in FSDP1_EXPORTS:
        assert not hasattr(_fully_shard, name), name


def test_wrap_exports_known():
    assert set(wrap.__all__) <= WRAP_EXPORTS


def test_classification():
    assert is_fsdp1("torch.distributed.fsdp.FullyShardedDataParallel.no_sync")
    assert is_fsdp1("torch.distributed.fsdp.wrap.ModuleWrapPolicy")
    assert is_fsdp1("torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler")
    assert not is_fsdp1("torch.distributed.fsdp.fully_shard")
    assert not is_fsdp1("torch.distributed.fsdp._fully_shard._fully_shard.FSDPModule")
    assert not is_fsdp1("torch.distributed._composable.fsdp.fully_shard")
    assert not is_fsdp1("torch.distributed.fsdp")
    assert not is_fsdp1("fairscale.nn.FullyShardedDataParallel")
    assert canonical("torch.distributed.fsdp.api.ShardingStrategy.FULL_SHARD") == "torch.distributed.fsdp.ShardingStrategy.FULL_SHARD"
    assert (
        canonical("torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel")
        == "torch.distributed.fsdp.FullyShardedDataParallel"
    )


def test_prefilter_lets_every_fsdp1_fixture_through():
    inputs = list((FIXTURES / "rewrite").glob("*/before.py")) + list((FIXTURES / "train").glob("*/fsdp1.py"))
    for path in inputs:
        text = path.read_text()
        if "torch.distributed" in text and any(name in text for name in FSDP1_EXPORTS | WRAP_EXPORTS):
            assert may_use_fsdp1(path.read_bytes()), path


def test_prefilter_rejects_files_without_fsdp1():
    assert not may_use_fsdp1(b"from fairscale.nn import FullyShardedDataParallel\n")
    assert not may_use_fsdp1(b"from torch.distributed.fsdp import fully_shard, FSDPModule\n")
    assert not may_use_fsdp1(b"import functools\n@functools.wraps(f)\ndef fsdp_helper(): pass\n")
    assert may_use_fsdp1(b"import torch.distributed.fsdp as fsdp\nfsdp.ShardingStrategy\n")


def test_prefilter_follows_every_import_route():
    routes = [
        b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n",
        b"import torch\nm = torch.distributed.fsdp.FullyShardedDataParallel(m)\n",
        b"from torch.distributed import fsdp\nfsdp.ShardingStrategy\n",
        b"from torch.distributed import (\n    barrier,\n    fsdp,\n)\nfsdp.ShardingStrategy\n",
        b"from torch import distributed as dist\ndist.fsdp.ShardingStrategy\n",
        b"import torch.distributed as dist\ndist.fsdp.ShardingStrategy\n",
    ]
    for source in routes:
        assert may_use_fsdp1(source), source
    # relative imports inside torch's own fsdp package never resolve to absolute names
    assert not may_use_fsdp1(b"from ._common_utils import FullyShardedDataParallel  # fsdp\n")
