"""The probe's view of FSDP1 and FSDP2 models in one process (world size 1, gloo)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from migrate_fsdp.verify import sharding


@pytest.fixture(scope="module")
def world_of_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 6))
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.blocks(x))


def trained(model):
    model(torch.ones(2, 6)).sum().backward()
    return model


def test_fsdp1_and_fsdp2_give_the_same_units_norms_and_digests(world_of_one):
    torch.manual_seed(0)
    one, two = Net(), Net()
    two.load_state_dict(one.state_dict())
    fsdp1 = trained(FSDP(one, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=torch.device("cpu")))
    mesh = init_device_mesh("cpu", (1,))
    for module in reversed(list(two.modules())):
        if isinstance(module, nn.Linear):
            fully_shard(module, mesh=mesh)
    fully_shard(two, mesh=mesh)
    fsdp2 = trained(two)

    assert set(sharding.find_units().modules) == {"Net:", "Net:blocks.0", "Net:blocks.1", "Net:head",
                                                   "Net#2:", "Net#2:blocks.0", "Net#2:blocks.1", "Net#2:head"}
    params1, params2 = list(fsdp1.parameters()), list(fsdp2.parameters())
    units1, units2 = sharding.find_units(params1), sharding.find_units(params2)  # each optimizer's own model
    assert set(units1.modules) == set(units2.modules) == {"", "blocks.0", "blocks.1", "head"}
    assert units1.settings["blocks.0"]["origin"] == "FSDP1 NO_SHARD" and units2.settings["head"]["origin"] == "FSDP2"
    # The root owns no parameters (all sit in the wrapped Linears): both versions describe it alike.
    root1, root2 = ({k: v for k, v in u.settings[""].items() if k != "origin"} for u in (units1, units2))
    assert root1 == root2 == dict.fromkeys(root1)
    for use_grads in (False, True):
        a = sharding.global_stats(params1, units1.primary, use_grads)
        b = sharding.global_stats(params2, units2.primary, use_grads)
        assert a[1:] == b[1:]  # digest and element count: exact
        assert a[0] == pytest.approx(b[0], rel=1e-12)


def test_digest_ignores_how_elements_are_split():
    x = torch.randn(1000)
    whole = sharding._digest(x)
    parts = sum(sharding._digest(chunk) for chunk in x.split(37))
    assert torch.equal(whole, parts)
    y = x.clone()
    y[5] = torch.nextafter(y[5], torch.tensor(float("inf")))
    assert not torch.equal(sharding._digest(y), whole)
