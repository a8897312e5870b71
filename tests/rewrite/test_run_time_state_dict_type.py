"""A state-dict type known only at run time (MF202): the rewrite saves what FSDP1 saved, FULL or SHARDED.

fixtures/state_dicts/run_time_type/fsdp1.py reads its checkpoint type from the command line into a config
dataclass and takes the model and optimizer states under `FSDP.state_dict_type(model, cfg.checkpoint_type)`. Both
versions run on 2 gloo ranks with each type; the losses and every saved tensor must be the same.
"""

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from migrate_fsdp.rewrite.api import rewrite_source
from tests.support import FIXTURES, step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

SCRIPT = FIXTURES / "state_dicts" / "run_time_type" / "fsdp1.py"


def _tensors(value, prefix=""):
    """Every tensor of a nested state dict by its path (optimizer states are keyed by parameter name in both)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{prefix}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _tensors(item, f"{prefix}/{index}")
    elif isinstance(value, torch.Tensor):
        yield prefix, value


def _saved(directory, checkpoint_type):
    if checkpoint_type == "FULL_STATE_DICT":
        return torch.load(directory / "full.pt", weights_only=False)
    dcp_to_torch_save(directory / "sharded", directory / "sharded.pt")
    return torch.load(directory / "sharded.pt", weights_only=False)


@pytest.mark.parametrize("checkpoint_type", ["FULL_STATE_DICT", "SHARDED_STATE_DICT"])
def test_the_type_read_at_run_time_saves_what_fsdp1_saved(tmp_path, checkpoint_type):
    result = rewrite_source(SCRIPT.read_bytes(), str(SCRIPT))
    assert "FSDP.state_dict_type" not in result.code and "fully_shard(" in result.code
    rewritten = tmp_path / "rewritten.py"
    rewritten.write_bytes(result.new_source)
    runs = {}
    for side, script in (("old", SCRIPT), ("new", rewritten)):
        saves = tmp_path / side
        saves.mkdir()
        steps = step_lines(torchrun(script, "--checkpoint_type", checkpoint_type, "--save", saves).stdout)
        runs[side] = steps, dict(_tensors(_saved(saves, checkpoint_type)))
    (old_steps, old), (new_steps, new) = runs["old"], runs["new"]
    assert len(old_steps) == 4 and new_steps == old_steps
    assert sorted(new) == sorted(old)
    for key, tensor in old.items():
        assert torch.equal(new[key], tensor), key
