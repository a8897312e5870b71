"""A whole recipe-shaped project, rewritten as one program, trains like its FSDP1 original on 2 gloo ranks.

fixtures/projects/recipe_runtime: config dataclasses overridden from the command line, the mixed precision and
the wrap policy from a helper module (chosen at run time), no_sync accumulation, clipping, a consolidated model and
optimizer checkpoint saved from a checkpointing module. test_projects.py checks the rewrite's exact output; this
runs both versions.
"""

import shutil

import pytest
import torch

from tests.support import FIXTURES, step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

CASE = FIXTURES / "projects" / "recipe_runtime"


def _run(tmp_path, case, side: str, script: str, saved: str, *flags: str):
    """One side of a fixture project run on 2 gloo ranks with `--save_dir`: its step lines and the file it saved."""
    project = tmp_path / side
    shutil.copytree(case / side, project)
    saves = tmp_path / f"{side}_saves"
    saves.mkdir()
    done = torchrun(project / script, "--save_dir", saves, *flags, env={"PYTHONPATH": str(project)})
    return step_lines(done.stdout), torch.load(saves / saved, weights_only=False)


def _train(tmp_path, side: str, *flags: str):
    return _run(tmp_path, CASE, side, "recipe/train.py", "ckpt.pt", *flags)


def test_fp32_losses_and_norms_match_and_the_checkpoints_hold_the_same_state(tmp_path):
    old_steps, old = _train(tmp_path, "before", "--no_mixed_precision")
    new_steps, new = _train(tmp_path, "after", "--no_mixed_precision")
    assert len(old_steps) == 4 and new_steps == old_steps
    assert sorted(new["model"]) == sorted(old["model"])
    for name, tensor in old["model"].items():
        # Active clipping: FSDP1 and FSDP2 sum the norm's parts in another order (an ulp, as documented).
        torch.testing.assert_close(new["model"][name], tensor, rtol=1e-6, atol=1e-6)
    assert sorted(new["optimizer"]["state"]) == sorted(old["optimizer"]["state"])
    for name, state in old["optimizer"]["state"].items():
        torch.testing.assert_close(new["optimizer"]["state"][name]["exp_avg"], state["exp_avg"], rtol=1e-5, atol=1e-6)


def test_bf16_mixed_precision_chosen_at_run_time_trains_alike(tmp_path):
    old_steps, _ = _train(tmp_path, "before")
    new_steps, _ = _train(tmp_path, "after")
    assert len(new_steps) == len(old_steps) == 4
    for old_line, new_line in zip(old_steps, new_steps):
        old_loss, new_loss = float(old_line.split()[3]), float(new_line.split()[3])
        # bf16 with accumulation: FSDP1 accumulates in bf16 under no_sync, FSDP2 in float32 (documented).
        assert abs(old_loss - new_loss) <= 2e-2 * abs(old_loss)


SHARED_LOOP = FIXTURES / "projects" / "shared_loop"


def _train_shared_loop(tmp_path, side: str, *flags: str):
    return _run(tmp_path, SHARED_LOOP, side, "loop/train.py", "model.pt", *flags)


@pytest.mark.parametrize("flags", [(), ("--zero2",)], ids=["full_shard", "shard_grad_op"])
def test_a_model_handed_to_a_shared_loop_and_a_checkpoint_module_trains_alike(tmp_path, flags):
    """fixtures/projects/shared_loop: the model goes to a no_sync loop of its file, a step in another module that
    clips under `if cfg.enable_fsdp:`, and a checkpoint module whose uncalled scatter function stays FSDP1 (its
    LOCAL_STATE_DICT load converts); a kwargs dict the script prints stays as printed."""
    # Active clipping: the norm's parts are summed in another order (an ulp, as documented).
    _same_to_rounding(_train_shared_loop(tmp_path, "before", *flags), _train_shared_loop(tmp_path, "after", *flags))


def _same_to_rounding(old_run, new_run) -> None:
    """Four steps with the same numbers and the same saved tensors, up to float rounding."""
    (old_steps, old), (new_steps, new) = old_run, new_run
    assert len(old_steps) == len(new_steps) == 4
    for old_line, new_line in zip(old_steps, new_steps):
        old_numbers, new_numbers = [float(w) for w in old_line.split()[1::2]], [float(w) for w in new_line.split()[1::2]]
        assert new_numbers == pytest.approx(old_numbers, rel=1e-5)
    assert sorted(new) == sorted(old)
    for name, tensor in old.items():
        torch.testing.assert_close(new[name], tensor, rtol=1e-5, atol=1e-6)


SECOND_ENTRY = FIXTURES / "projects" / "second_entry_point"


def test_a_training_script_converts_beside_an_entry_point_whose_model_stays(tmp_path):
    """fixtures/projects/second_entry_point: export.py's model stays FSDP1 (a wrapper internal), and nothing hands it
    on or imports it, so train.py's model and its loop in another module convert, and train as before."""
    (old_steps, old), (new_steps, new) = (_run(tmp_path, SECOND_ENTRY, side, "entry/train.py", "model.pt") for side in ("before", "after"))
    assert len(old_steps) == 4
    for old_line, new_line in zip(old_steps, new_steps, strict=True):
        old_numbers, new_numbers = [float(w) for w in old_line.split()[1::2]], [float(w) for w in new_line.split()[1::2]]
        assert new_numbers == pytest.approx(old_numbers, rel=1e-5)  # clipping may be active: an ulp (documented)
    assert sorted(new) == sorted(old)
    for name, tensor in old.items():
        torch.testing.assert_close(new[name], tensor, rtol=1e-5, atol=1e-6)
    after = SECOND_ENTRY / "after" / "entry"
    assert "fully_shard(make_model()" in (after / "train.py").read_text()
    assert "FSDP(make_model()" in (after / "export.py").read_text()  # the blocked entry point stays FSDP1


CHECKPOINT_HELPERS = FIXTURES / "projects" / "checkpoint_helpers"


@pytest.mark.parametrize("flags", [("--fsdp",), ()], ids=["fsdp", "ddp"])
def test_checkpoint_helpers_serving_any_model_save_and_resume_alike(tmp_path, flags):
    """fixtures/projects/checkpoint_helpers: save and load helpers in a module naming no FSDP take FSDP, DDP and
    plain models; the rewrite has them give an FSDP2 model FSDP1's full state dict and leaves the others' calls as
    they were. Saved before resuming and after, both versions: the same losses and the same final checkpoint."""
    (old_steps, old), (new_steps, new) = (
        _run(tmp_path, CHECKPOINT_HELPERS, side, "resume/train.py", "model.pt", *flags) for side in ("before", "after")
    )
    assert len(old_steps) == 4 and new_steps == old_steps
    assert sorted(new) == sorted(old)
    for name, tensor in old.items():
        assert torch.equal(new[name], tensor), name
    after = CHECKPOINT_HELPERS / "after" / "resume"
    assert "return fully_shard(model" in (after / "train.py").read_text()
    assert "fsdp2_load_state_dict(model, state)" in (after / "checkpoint.py").read_text()


SETUP_SETS_TYPE = FIXTURES / "projects" / "setup_sets_type"


def test_a_state_dict_type_set_for_good_that_nothing_reads_goes(tmp_path):
    """fixtures/projects/setup_sets_type: the setup function's LOCAL_STATE_DICT setting is never read (the only state
    dict is taken under a FULL block), so it goes and the model converts: the same checkpoint as FSDP1's."""
    saved = {}
    for side in ("before", "after"):
        project = tmp_path / side
        shutil.copytree(SETUP_SETS_TYPE / side, project)
        torchrun(project / "dit" / "train.py", tmp_path / f"{side}.pt", env={"PYTHONPATH": str(project)})
        saved[side] = torch.load(tmp_path / f"{side}.pt", weights_only=False)
    assert sorted(saved["after"]) == sorted(saved["before"]) == ["bias", "weight"]
    for name, tensor in saved["before"].items():
        assert torch.equal(saved["after"][name], tensor), name
    assert "set_state_dict_type" not in (SETUP_SETS_TYPE / "after" / "dit" / "setup.py").read_text()


GRAD_NORM_MODULE = FIXTURES / "projects" / "grad_norm_module"


@pytest.mark.parametrize("flags", [(), ("--data_parallel", "sdp")], ids=["full_shard", "shard_grad_op"])
def test_norms_summed_over_shards_by_hand_give_fsdp1s_numbers(tmp_path, flags):
    """fixtures/projects/grad_norm_module: a metrics module sums each rank's squared gradients and parameters and
    all-reduces the sums (MF216); the gradient norm clips by scaling, the parameter norm is read after an evaluation.
    FSDP2's local shards split the elements otherwise, so the sums agree to rounding."""
    _same_to_rounding(
        _run(tmp_path, GRAD_NORM_MODULE, "before", "train.py", "model.pt", *flags),
        _run(tmp_path, GRAD_NORM_MODULE, "after", "train.py", "model.pt", *flags),
    )


POLICY_HANDED = FIXTURES / "projects" / "policy_handed_to_a_setup_function"


def test_policies_handed_to_a_setup_function_convert_where_written_and_train_alike(tmp_path):
    """fixtures/projects/policy_handed_to_a_setup_function: the wrap policies and the bf16 mixed precision reach the
    constructor as arguments of the project's setup function (inline, through a variable, imported); each converts
    where it is written, no FSDP1 is left, and the losses are FSDP1's."""
    steps = {}
    for side in ("before", "after"):
        project = tmp_path / side
        shutil.copytree(POLICY_HANDED / side, project)
        steps[side] = step_lines(torchrun(project / "train.py", env={"PYTHONPATH": str(project)}).stdout)
    assert len(steps["before"]) == 4 and steps["after"] == steps["before"]
    assert not any("torch.distributed.fsdp.wrap" in p.read_text() for p in (POLICY_HANDED / "after").glob("*.py"))


OPTIMIZER_SUMS = FIXTURES / "projects" / "optimizer_sums_its_groups"


@pytest.mark.parametrize("max_norm", ["0.5", "0.1"], ids=["clipping_idle", "clipping_active"])
def test_an_optimizer_summing_its_groups_shards_by_hand_gives_fsdp1s_numbers(tmp_path, max_norm):
    """fixtures/projects/optimizer_sums_its_groups: the optimizer's own clipping sums the squares of the gradient
    shards in its parameter groups and all-reduces them (MF216); it reads them through the dispatching helper, since
    its groups may hold any model's parameters, and scales them in place as they are. The numbers are FSDP1's."""
    _same_to_rounding(
        _run(tmp_path, OPTIMIZER_SUMS, "before", "train.py", "model.pt", "--max_norm", max_norm),
        _run(tmp_path, OPTIMIZER_SUMS, "after", "train.py", "model.pt", "--max_norm", max_norm),
    )


POLICIES_FROM_METHODS = FIXTURES / "projects" / "policies_from_methods"


@pytest.mark.parametrize("strategy", ["full-shard", "shard-grad-op"])
def test_policies_returned_by_methods_and_a_strategy_held_on_self_convert_and_train_alike(tmp_path, strategy):
    """fixtures/projects/policies_from_methods: the wrap policies come from the model's methods (an `_or_policy` of a
    submodule's policy and an inline one), the strategy from an attribute its class sets from a string. Each converts
    where it is written, no FSDP1 is left, and the same units are sharded: the losses are FSDP1's."""
    steps = {}
    for side in ("before", "after"):
        project = tmp_path / side
        shutil.copytree(POLICIES_FROM_METHODS / side, project)
        done = torchrun(project / "train.py", "--sharding_strategy", strategy, env={"PYTHONPATH": str(project)})
        steps[side] = step_lines(done.stdout)
    assert len(steps["before"]) == 4 and steps["after"] == steps["before"]
    assert all(line.endswith("units 3") for line in steps["before"])
    assert not any("torch.distributed.fsdp.wrap" in p.read_text() for p in (POLICIES_FROM_METHODS / "after").rglob("*.py"))



GROUP_BROADCAST = FIXTURES / "projects" / "group_broadcast_elsewhere"


def test_a_model_over_a_group_of_its_own_resumes_from_the_worlds_rank_0_as_before(tmp_path):
    """fixtures/projects/group_broadcast_elsewhere: each rank's model is sharded over a process group of its own;
    FSDP1's full optimizer state is gathered to and scattered from the world's rank 0 all the same (the calls' `group`
    is None), as FSDP2's full state dict options: the program converts, rank 0 alone gets the state and rank 1
    resumes from it."""
    steps = {}
    for side in ("before", "after"):
        project = tmp_path / side
        shutil.copytree(GROUP_BROADCAST / side, project)
        saves = tmp_path / f"{side}_saves"
        saves.mkdir()
        steps[side] = step_lines(torchrun(project / "train.py", "--save_dir", saves, env={"PYTHONPATH": str(project)}).stdout)
    (line,) = steps["before"]
    assert steps["after"] == steps["before"]
    assert line.split()[4] == line.split()[5]  # rank 1 resumed from rank 0's state
    assert line.endswith("kept [2.0, 0.0]")  # the world's rank 0 alone got the full state dict
    assert "FSDP." not in (GROUP_BROADCAST / "after" / "ckpt.py").read_text()

