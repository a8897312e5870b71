"""LOCAL_STATE_DICT (MF202) becomes FSDP2's sharded state dict: a program that saves its own shards and resumes
from them trains on exactly as under FSDP1.

fixtures/state_dicts/local_resume/fsdp1.py saves each rank's model and optimizer shards (torch.save, or the model
with torch.distributed.checkpoint), trains two steps, loads them back and trains the same two steps again. Both
versions run on 2 gloo ranks; every loss must be the same, and the resumed steps must repeat the first ones.
"""

import pytest

from migrate_fsdp.rewrite.api import rewrite_source
from tests.support import FIXTURES, step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

SCRIPT = FIXTURES / "state_dicts" / "local_resume" / "fsdp1.py"


@pytest.mark.parametrize("flags", [(), ("--dcp",)], ids=["torch_save", "dcp"])
def test_a_local_checkpoint_resumes_as_under_fsdp1(tmp_path, flags):
    result = rewrite_source(SCRIPT.read_bytes(), str(SCRIPT))
    # Only the heads-up that checkpoints an FSDP1 run wrote under LOCAL do not load (MF219): this one resumes its own.
    assert {d.code for d in result.diagnostics} == {"MF219"} and "torch.distributed.fsdp import" in result.code
    assert "FullyShardedDataParallel" not in result.code and "StateDictType" not in result.code
    rewritten = tmp_path / "rewritten.py"
    rewritten.write_bytes(result.new_source)
    runs = {}
    for side, script in (("old", SCRIPT), ("new", rewritten)):
        saves = tmp_path / side
        saves.mkdir()
        runs[side] = step_lines(torchrun(script, "--save", saves, *flags).stdout)
    assert len(runs["old"]) == 7 and runs["new"] == runs["old"]
    trained_on, resumed = runs["new"][3:5], runs["new"][5:]
    if not flags:  # the optimizer's momentum came back too
        assert resumed == trained_on
    else:  # the model's state only, then a new optimizer: its first step is the same
        assert resumed[0] == trained_on[0]
