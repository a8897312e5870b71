"""The verdict on synthetic runs: each check passes on agreement and fails on the difference it watches."""

from migrate_fsdp.verify.compare import compare
from tests.verify.helpers import run, unit

LOSSES = [4.5, 4.25, 4.0]


def checks(verdict) -> dict:
    return {c.name: c for c in verdict.checks}


def test_identical_runs_pass_every_check():
    verdict = compare(run("old", LOSSES), run("new", LOSSES), 3)
    assert verdict.passed
    assert set(checks(verdict)) == {"steps", "sharded modules", "gradient sync", "loss", "grad norm",
                                    "param norm", "gradient bits", "parameter bits"}


def test_runs_to_their_end_must_take_the_same_steps_with_the_same_optimizers():
    verdict = compare(run("old", LOSSES), run("new", LOSSES[:2]), None)
    assert checks(verdict)["steps"].summary == "old ran 3 optimizer steps, new ran 2"
    assert len(verdict.steps) == 4  # the two common steps on both ranks are still compared
    swapped = run("new", LOSSES)
    for rank in swapped.ranks:
        rank.steps[1]["optimizer"] = 1
    assert "step 1: old stepped optimizer 0, new stepped optimizer 1" in checks(compare(run("old", LOSSES), swapped, None))["steps"].summary


def test_a_cap_beyond_the_scripts_length_compares_the_steps_it_has_with_a_note():
    verdict = compare(run("old", LOSSES), run("new", LOSSES), 7)
    assert verdict.passed and checks(verdict)["steps"].summary == "3 optimizer steps"
    assert verdict.notes == ["both versions ended after 3 optimizer steps, before the --steps 7 cap; "
                             "those steps are compared"]
    assert compare(run("old", LOSSES), run("new", LOSSES), 3).notes == []


def test_under_a_cap_a_different_number_of_steps_still_fails():
    verdict = compare(run("old", LOSSES), run("new", LOSSES[:2]), 7)
    assert not verdict.passed and checks(verdict)["steps"].summary == "old ran 3 optimizer steps, new ran 2"
    assert verdict.notes == []


def test_one_ulp_of_loss_fails_a_bit_exact_setting():
    verdict = compare(run("old", LOSSES), run("new", [4.5, 4.25, 4.000000476837158]), 3)
    assert not verdict.passed
    loss = checks(verdict)["loss"]
    assert not loss.passed and "step 2" in loss.summary
    assert loss.worst["step"] == 2


def test_a_missing_unit_fails_even_when_losses_agree():
    new_units = {"": unit(reshard_after_forward=False)}
    verdict = compare(run("old", LOSSES), run("new", LOSSES, units=new_units), 3)
    units = checks(verdict)["sharded modules"]
    assert not units.passed and "not sharded by the new version: layers.0" in units.summary
    assert checks(verdict)["loss"].passed


def test_a_different_unit_setting_is_named():
    new_units = {"": unit(reshard_after_forward=False), "layers.0": unit(reshard_after_forward=False)}
    verdict = compare(run("old", LOSSES), run("new", LOSSES, units=new_units), 3)
    assert "layers.0: reshard_after_forward True (old) vs False (new)" in checks(verdict)["sharded modules"].summary


def test_a_different_gradient_sync_pattern_fails():
    verdict = compare(run("old", LOSSES, backwards=2, unsynced_backwards=1), run("new", LOSSES, backwards=2), 3)
    sync = checks(verdict)["gradient sync"]
    assert not sync.passed and "1 without gradient sync" in sync.summary


def test_different_bits_fail_where_the_setting_is_exact():
    verdict = compare(run("old", LOSSES), run("new", LOSSES, param_digest=[9, 9]), 3)
    assert not checks(verdict)["parameter bits"].passed


def test_memory_more_than_ten_percent_above_is_flagged_but_does_not_fail():
    verdict = compare(run("old", LOSSES, peak_bytes=1000), run("new", LOSSES, peak_bytes=1101), 3)
    assert verdict.passed
    assert all(m["flagged"] for m in verdict.memory)
    assert "1.10x the old one" in verdict.warnings[0]
    assert not compare(run("old", LOSSES, peak_bytes=1000), run("new", LOSSES, peak_bytes=1100), 3).memory[0]["flagged"]


def test_speed_is_the_median_of_the_uninstrumented_steps_after_the_first():
    old, new = run("old", LOSSES * 2), run("new", LOSSES * 2)
    for k, record in enumerate(old.ranks[0].steps):
        record.update(time_s=[9.0, 5.0, 0.2, 0.4, 0.3, 0.5][k], instrumented=k < 2)
    verdict = compare(old, new, 6)
    assert verdict.speed["old_median_s"] == 0.35
    assert verdict.speed["new_median_s"] == 0.01
