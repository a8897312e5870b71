"""Training rules under --select/--ignore: a rule whose output needs another rule's reports instead.

The whole-file fixtures run every rule; these run subsets. FSDP2 code only
works on FSDP2 models, so without MF101 (which makes them) the training
rules report; MF202 removes a state-dict block only when MF203 converts the
optimizer calls it governs; and each rule leaves the others' business alone.
"""

import textwrap

from migrate_fsdp.rewrite.api import rewrite_source
from migrate_fsdp.rewrite.selection import Selection

SOURCE = textwrap.dedent(
    """\
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import StateDictType


    def train(model: FSDP, optimizer, batch):
        with model.no_sync():
            model(batch).sum().backward()
        norm = model.clip_grad_norm_(1.0)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT):
            return norm, model.state_dict(), FSDP.optim_state_dict(model, optimizer)
    """
)


def run(select=None, ignore=None):
    return rewrite_source(SOURCE, "train.py", Selection.from_prefixes(select, ignore))


def codes(result) -> list[str]:
    return [d.code for d in result.diagnostics]


def test_everything_converts_with_all_rules():
    result = run()
    assert result.diagnostics == []
    assert "FullyShardedDataParallel" not in result.code and "FSDP." not in result.code


def test_without_the_wrap_rule_every_training_conversion_is_reported():
    result = run(ignore=["MF101"])
    assert "set_requires_gradient_sync" not in result.code
    assert "get_model_state_dict" not in result.code
    assert sorted(set(codes(result))) == ["MF201", "MF202", "MF203", "MF205", "MF206"]
    assert all("MF101 (wrap-call) is not selected" in d.message for d in result.diagnostics)


def test_state_dict_block_stays_when_the_optimizer_rule_is_off():
    result = run(ignore=["MF203"])
    assert "with FSDP.state_dict_type(" in result.code
    block = [d for d in result.diagnostics if d.code == "MF202"]
    assert len(block) == 1 and "MF203 (optimizer state) is not selected" in block[0].message
    # The model's own call is still converted: its setting is known.
    assert "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))" in result.code


def test_optimizer_calls_convert_inside_a_block_the_state_dict_rule_leaves():
    result = run(ignore=["MF202"])
    assert "with FSDP.state_dict_type(" in result.code
    assert "get_optimizer_state_dict(model, optimizer)" in result.code
    assert "MF900" in codes(result)  # the block itself, which nothing converts now


def test_a_single_rule_touches_only_its_own_calls():
    result = run(select=["MF201", "MF101", "MF206"])
    assert "fsdp2_no_sync(model)" in result.code
    assert "model.clip_grad_norm_(1.0)" in result.code
    assert "FSDP.state_dict_type(" in result.code
