"""A state-dict type set on a model for good (`FSDP.set_state_dict_type`) whose model goes to code out of sight: that
code may read the model's state dict under the setting. A sharded setting (SHARDED, LOCAL) reads there as FSDP2's own
`state_dict()` does, each rank's shards in place, so the model converts; a full one, or one offloading to the CPU,
would be lost there, so the model stays FSDP1."""

import pytest

from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

SETUP = '''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import {config}StateDictType


def setup(net):
    model = FSDP(net, device_id=torch.device("cpu"))
    FSDP.set_state_dict_type(model, StateDictType.{kind}{argument})
    return model
'''

# LLaMA2-Accessory's Large-DiT shape: the model the setup function returns goes to a library the program lacks.
TRAIN = b'''import diffusion

from setup import setup


def train(net, batch):
    model = setup(net)
    diffusion.training_losses(model, batch)["loss"].backward()
'''


def _rewrite(source: str):
    selection = Selection.from_prefixes(None, None)
    files = {"setup.py": source.encode(), "train.py": TRAIN}
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()])
    [setup] = [r for r in results if r.path == "setup.py"]
    return setup.new_source.decode(), [d.code for r in results for d in r.diagnostics]


@pytest.mark.parametrize("kind", ["SHARDED_STATE_DICT", "LOCAL_STATE_DICT"])
def test_a_sharded_setting_converts_with_its_model(kind):
    out, codes = _rewrite(SETUP.format(config="", kind=kind, argument=""))
    assert codes == (["MF219"] if kind == "LOCAL_STATE_DICT" else [])  # a heads-up: FSDP1's LOCAL files do not load
    assert "fully_shard(net" in out and "set_state_dict_type" not in out


@pytest.mark.parametrize(
    ("config", "kind", "argument"),
    [
        ("", "FULL_STATE_DICT", ""),
        ("ShardedStateDictConfig, ", "SHARDED_STATE_DICT", ", ShardedStateDictConfig(offload_to_cpu=True)"),
    ],
)
def test_a_setting_fsdp2_reads_otherwise_keeps_the_model(config, kind, argument):
    out, codes = _rewrite(SETUP.format(config=config, kind=kind, argument=argument))
    assert "MF003" in codes and "MF202" in codes
    assert "FSDP(net" in out and "fully_shard" not in out
