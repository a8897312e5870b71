"""The tolerance model: which setting a pair of runs is in, and what each quantity may differ by."""

import pytest

from migrate_fsdp.verify import tolerance
from tests.verify.helpers import step, unit

U32, U16 = 2.0**-24, 2.0**-8


def setup(world=2, **units):
    return [{"world_size": world, "device": "cpu", "units": units or {"": unit()}}]


def test_world_size_two_fp32_is_bit_exact():
    s = tolerance.detect(setup(), setup(), [step(0, 1.0)], [step(0, 1.0)])
    assert s.exact and s.label() == "bit-exact"
    assert tolerance.loss_tolerance(s, 3, 4.0, "float32") == 0


def test_reduction_over_four_ranks_perturbs_each_update_by_its_sum_bound():
    units = {"": unit(shard_size=4)}
    s = tolerance.detect(setup(4, **units), setup(4, **units), [step(0, 1.0)] * 3, [step(0, 1.0)] * 3)
    assert s.reduction_order == pytest.approx(2 * 3 * U32)
    assert tolerance.loss_tolerance(s, 0, 4.0, "float32") == 0  # no update has run yet
    assert tolerance.loss_tolerance(s, 2, 4.0, "float32") == pytest.approx((2 * 6 * U32 + 2 * U32) * 4.0)
    assert tolerance.norm_rtol(s, 1, 1000) == pytest.approx(2 * 6 * U32 + 1000 * 2.0**-53)


def test_two_by_two_hsdp_mesh_sums_pairs_only_and_stays_exact():
    units = {"": unit(shard_size=2, replicate_size=2)}
    assert tolerance.detect(setup(4, **units), setup(4, **units), [], []).exact


def test_bf16_accumulation_without_sync_gets_its_own_bound():
    old = {"": unit(param_dtype="bfloat16", reduce_dtype="float32")}
    new = {"": unit(param_dtype="bfloat16", reduce_dtype="float32", origin="FSDP2")}
    steps = [step(0, 1.0, backwards=3, unsynced_backwards=2)]
    s = tolerance.detect(setup(**old), setup(**new), steps, steps)
    assert s.accumulation == pytest.approx(2 * (U16 + U32))
    assert "bfloat16 by the old version and in float32 by the new one" in s.notes[0]


def test_accumulation_in_the_same_dtype_on_both_sides_is_exact():
    old = {"": unit(param_dtype="bfloat16", reduce_dtype="bfloat16")}
    new = {"": unit(param_dtype="bfloat16", reduce_dtype="bfloat16", origin="FSDP2")}
    steps = [step(0, 1.0, backwards=2, unsynced_backwards=1)]
    assert tolerance.detect(setup(**old), setup(**new), steps, steps).exact


def test_active_clipping_contributes_the_observed_coefficient_difference():
    clip = {"total_norm": 2.0, "max_norm": 1.0, "dtype": "float32"}
    old = [step(0, 1.0, clip=clip), step(1, 1.0, clip={**clip, "total_norm": 0.5})]
    new = [step(0, 1.0, clip={**clip, "total_norm": 2.0 * (1 + 1e-7)}), step(1, 1.0, clip={**clip, "total_norm": 0.6})]
    s = tolerance.detect(setup(), setup(), old, new)
    assert s.clipping[0] == pytest.approx(1e-7)
    assert s.clipping[1] == 0.0  # below max_norm on both sides: the coefficient is 1 on both
    assert tolerance.clip_rtol(s, 0, 1024, "float32") == pytest.approx(2 * U32 * (10 + 2))


def test_tolerances_grow_with_the_updates_that_came_before():
    units = {"": unit(shard_size=8)}
    s = tolerance.detect(setup(8, **units), setup(8, **units), [], [])
    tols = [tolerance.loss_tolerance(s, k, 1.0, "float32") for k in range(5)]
    assert tols[0] == 0 and all(a < b for a, b in zip(tols[1:], tols[2:]))
