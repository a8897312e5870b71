"""FSDP1's `rank0_only` is rank 0 of the group the model is sharded over, not the world's: the rewrite keeps that.

One FSDP1 script takes a FULL_STATE_DICT with `rank0_only=True` from models laid out four ways (the whole world,
HYBRID_SHARD over a 2-D mesh, NO_SHARD, and a process group of one rank per replica, as model-parallel trainers
use); the script and its rewrite run on 2 gloo ranks and must leave the state dict on the same ranks.
"""

import pytest

from migrate_fsdp.rewrite.api import rewrite_source
from tests.support import torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

FSDP1 = '''
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullStateDictConfig, ShardingStrategy, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def consolidated(model):
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
        return model.state_dict()


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("replicate", "shard"))
    own = [dist.new_group([r]) for r in range(world)][rank]
    cpu = torch.device("cpu")
    layouts = {
        "world": FSDP(nn.Linear(4, 4), device_id=cpu),
        "hybrid": FSDP(nn.Linear(4, 4), device_id=cpu, sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=mesh),
        "no_shard": FSDP(nn.Linear(4, 4), device_id=cpu, sharding_strategy=ShardingStrategy.NO_SHARD),
        "own_group": FSDP(nn.Linear(4, 4), device_id=cpu, process_group=own),
    }
    for name, model in layouts.items():
        kept = [None] * world
        dist.all_gather_object(kept, sorted(consolidated(model)))
        if rank == 0:
            print("kept", name, kept)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def test_rank0_only_is_the_models_group_rank_0(tmp_path):
    original = tmp_path / "fsdp1.py"
    original.write_text(FSDP1)
    result = rewrite_source(FSDP1.encode(), "fsdp1.py")
    assert result.diagnostics == []
    rewritten = tmp_path / "fsdp2.py"
    rewritten.write_bytes(result.new_source)
    runs = [[line for line in torchrun(script).stdout.splitlines() if line.startswith("kept ")] for script in (original, rewritten)]
    assert len(runs[0]) == 4 and runs[1] == runs[0]
    assert "kept own_group [['bias', 'weight'], ['bias', 'weight']]" in runs[0]  # not the world's rank 0 alone
