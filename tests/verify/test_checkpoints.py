"""The `checkpoints` check on files saved the way FSDP1 and FSDP2 save them (no torchrun: the files are written here)."""

import torch

from migrate_fsdp.verify.checkpoints import check_checkpoints
from migrate_fsdp.verify.tolerance import Setting
from tests.verify.helpers import run

EXACT = Setting(world_size=2, device="cpu")
TOLERANCED = Setting(world_size=2, device="cpu", reduction_order=1e-6)


def full_state(scale=1.0, order=("a.weight", "b.weight")):
    """A FULL_STATE_DICT checkpoint: model and FSDP.optim_state_dict-style optimizer state, keyed by FQN."""
    model = {"a.weight": torch.arange(6.0).reshape(2, 3) * scale, "b.weight": torch.ones(3) * scale}
    state = {fqn: {"step": torch.tensor(5.0), "exp_avg": value * 0.1} for fqn, value in model.items()}
    return {"model": model, "optimizer": {"state": state, "param_groups": [{"lr": 0.01, "params": list(order)}]},
            "epoch": 1}


def saved(tmp_path, name, *objects):
    """A run that saved each object to its own file, and the paths."""
    the_run = run(name, [1.0, 0.5])
    paths = []
    for index, obj in enumerate(objects):
        path = tmp_path / name / f"ckpt{index}.pt"
        path.parent.mkdir(exist_ok=True)
        torch.save(obj, path)
        paths.append(str(path))
    the_run.ranks[0].saves = [{"kind": "torch.save", "path": p} for p in paths]
    return the_run


def check(tmp_path, old_objects, new_objects, setting=EXACT):
    old, new = saved(tmp_path, "old", *old_objects), saved(tmp_path, "new", *new_objects)
    return check_checkpoints(old, new, {}, setting, steps=2)


def test_the_same_state_in_another_param_group_order_is_bit_identical(tmp_path):
    result = check(tmp_path, [full_state()], [full_state(order=("b.weight", "a.weight"))])
    assert result.passed, result.summary
    assert result.summary == "1 saved file(s) compared by FQN, model and optimizer state bit-identical"


def test_one_changed_element_fails_where_the_setting_is_exact(tmp_path):
    changed = full_state()
    changed["optimizer"]["state"]["b.weight"]["exp_avg"][1] += 1e-6
    result = check(tmp_path, [full_state()], [changed])
    assert not result.passed
    assert "optimizer.state.b.weight.exp_avg: 1 of 3 elements differ" in result.summary


def test_a_toleranced_setting_allows_its_bound_and_no_more(tmp_path):
    assert check(tmp_path, [full_state()], [full_state(scale=1 + 1e-7)], TOLERANCED).passed
    result = check(tmp_path, [full_state()], [full_state(scale=1.01)], TOLERANCED)
    assert not result.passed and "model.a.weight: relative diff 0.01 >" in result.summary


def test_a_missing_optimizer_state_and_a_different_count_of_files_fail(tmp_path):
    without = full_state()
    del without["optimizer"]
    assert "optimizer.state.a.weight.exp_avg: missing" in check(tmp_path, [full_state()], [without]).summary
    assert check(tmp_path, [full_state()], [full_state(), full_state()]).summary == \
        "old saved 1 checkpoint(s), new saved 2"


def test_empty_files_of_other_ranks_compare_equal_and_nothing_saved_is_no_check(tmp_path):
    assert check(tmp_path, [full_state(), {}], [full_state(), {}]).passed
    assert check_checkpoints(run("old", [1.0]), run("new", [1.0]), {}, EXACT, steps=1) is None


def test_a_control_run_sets_each_tensors_tolerance_from_its_own_gap(tmp_path):
    """Long runs: 5 x the control's gap in the same tensor, not the first-order bound."""
    noisy = full_state()
    noisy["model"]["a.weight"] *= 1 + 1e-3  # the control strays in a.weight only
    control = saved(tmp_path, "control", noisy)
    new_a = full_state()
    new_a["model"]["a.weight"] *= 1 + 4e-3
    new_b = full_state()
    new_b["model"]["b.weight"] *= 1 + 4e-3
    old = saved(tmp_path, "old", full_state())
    within = check_checkpoints(old, saved(tmp_path, "new_a", new_a), {}, TOLERANCED, 2, (control, {}))
    assert within.passed and "80% of its tolerance at most" in within.summary, within.summary
    beyond = check_checkpoints(old, saved(tmp_path, "new_b", new_b), {}, TOLERANCED, 2, (control, {}))
    assert not beyond.passed and "model.b.weight: relative diff 0.004 >" in beyond.summary
