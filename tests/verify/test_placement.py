"""Where the two runs go: planned without a GPU, from the list of GPUs a machine would show."""

import pytest

from migrate_fsdp.verify import placement
from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.launcher import Launch


def test_cpu_hides_gpus_and_runs_in_turn():
    plan = placement.plan("cpu", 2, ["0", "1", "2", "3"], standalone=True)
    assert plan.device == "cpu" and not plan.concurrent
    assert plan.old_env == plan.new_env == {"CUDA_VISIBLE_DEVICES": ""}


def test_auto_picks_cpu_without_enough_gpus():
    assert placement.plan("auto", 2, [], standalone=True).device == "cpu"
    assert placement.plan("auto", 2, ["0"], standalone=True).device == "cpu"


def test_auto_picks_cuda_with_one_gpu_per_rank_and_takes_turns():
    plan = placement.plan("auto", 2, ["0", "1", "2"], standalone=True)
    assert plan.device == "cuda" and not plan.concurrent
    assert plan.old_env == plan.new_env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_two_n_gpus_run_side_by_side_on_disjoint_sets():
    plan = placement.plan("cuda", 2, ["0", "1", "2", "3", "4"], standalone=True)
    assert plan.concurrent
    assert plan.old_env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert plan.new_env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert "side by side" in plan.describe()


def test_disjoint_sets_keep_the_names_of_an_existing_visible_list(monkeypatch):
    monkeypatch.setattr(placement, "_gpu_count", lambda: 4)
    gpus = placement.visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 5,GPU-abc,7"})
    assert gpus == ["3", "5", "GPU-abc", "7"]
    plan = placement.plan("cuda", 2, gpus, standalone=True)
    assert plan.old_env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert plan.new_env["CUDA_VISIBLE_DEVICES"] == "GPU-abc,7"


def test_visible_gpus_counts_devices_when_no_list_is_set(monkeypatch):
    monkeypatch.setattr(placement, "_gpu_count", lambda: 3)
    assert placement.visible_gpus({}) == ["0", "1", "2"]


def test_own_rendezvous_flags_never_run_side_by_side():
    plan = placement.plan("cuda", 2, ["0", "1", "2", "3"], standalone=False)
    assert not plan.concurrent and plan.old_env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    # One node with a fixed port: two torchruns at once would both claim it.
    assert not Launch(2, 3, 60, rendezvous=[["--master-port", "29600"]]).standalone
    assert Launch(2, 3, 60).standalone


def test_cuda_without_enough_gpus_is_refused():
    with pytest.raises(VerifyError, match="needs 4 GPUs"):
        placement.plan("cuda", 4, ["0", "1"], standalone=True)


def test_standalone_rendezvous_by_default_and_rdzv_flags_passed_through():
    assert Launch(2, 3, 60).torchrun_flags("old") == ["--standalone"]
    launch = Launch(2, 3, 60, rendezvous=[["--nnodes", "2"], ["--rdzv-backend", "c10d"],
                                          ["--rdzv-endpoint", "head:29400"], ["--rdzv-id", "job"]])
    assert launch.multi_node
    assert launch.torchrun_flags("new") == ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                            "head:29400", "--rdzv-id", "job-new"]
    assert not Launch(2, 3, 60, rendezvous=[["--nnodes", "1"]]).multi_node
