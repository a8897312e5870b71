"""The long-run verdict: when a control run is needed, what it perturbs, and how the new version is judged by it."""

import json

import pytest
import torch

from migrate_fsdp.verify import envelope, perturb, tolerance
from migrate_fsdp.verify.compare import compare
from tests.verify.helpers import run, step, unit

LONG = envelope.EARLY_STEPS + 12


def _setting(**fields) -> tolerance.Setting:
    return tolerance.Setting(world_size=2, device="cpu", **fields)


def test_no_control_for_an_exact_setting_or_a_short_run():
    steps = [step(k, 1.0) for k in range(LONG)]
    assert envelope.control_perturbation(_setting(), steps, LONG) is None
    assert envelope.control_perturbation(_setting(accumulation=1e-3), steps, envelope.EARLY_STEPS) is None


def test_the_control_perturbs_by_the_detected_causes():
    clip = {"total_norm": 2.0, "max_norm": 1.0, "dtype": "float32"}
    steps = [step(k, 1.0, clip=clip) for k in range(LONG)]
    setting = _setting(reduction_order=1e-7, accumulation=3e-3, clipping=[1e-6] * LONG)
    spec = json.loads(envelope.control_perturbation(setting, steps, LONG))
    assert spec["elementwise"] == pytest.approx(3e-3 + 1e-7)
    assert spec["scale"] == pytest.approx(tolerance.clip_rounding(setting, 1000, "float32"))


def test_the_clip_norm_of_step_zero_counts_that_steps_accumulation():
    setting = _setting(accumulation=2.0**-8)
    assert tolerance.clip_rtol(setting, 0, 1000, "float32") > 2.0**-8


def test_the_noise_has_the_asked_size_is_the_same_on_every_replica_and_keeps_a_clipped_norm():
    grads = [torch.linspace(-1, 1, 101), torch.full((7,), 0.5)]

    def perturbed(spec, clipped):
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        norm = lambda: torch.linalg.vector_norm(torch.cat([p.grad for p in params])).item()
        before = norm()
        perturb.Perturbation(spec).apply(params, 3, clipped, norm)
        return [p.grad for p in params], before, norm()

    a, before, after = perturbed(perturb.encode(1e-3, 0.0), clipped=False)
    b, _, _ = perturbed(perturb.encode(1e-3, 0.0), clipped=False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # seeded by the step: replicas stay replicas
    relative = torch.cat([(x - g).abs() / g.abs().clamp_min(1e-12) for x, g in zip(a, grads)])
    assert relative[relative > 0].min() > 0.9e-3 and relative.max() < 1.1e-3
    _, before, after = perturbed(perturb.encode(1e-3, 0.0), clipped=True)
    assert after == pytest.approx(before, rel=1e-6)  # the clip sets the norm after the rounding
    _, before, after = perturbed(perturb.encode(1e-3, 1e-2), clipped=True)
    assert after != pytest.approx(before, rel=1e-6) and after == pytest.approx(before, rel=1e-2)


def _runs(new_param_gap, control_param_gap):
    """Old, new and control runs over LONG steps whose parameter norms differ by the given relative gaps."""
    units = {"": unit(param_dtype="bfloat16", reduce_dtype="float32")}
    changes = {"backwards": 2, "unsynced_backwards": 1}
    old = run("old", [1.0] * LONG, units=units, **changes)
    new = run("new", [1.0] * LONG, units=units, **changes)
    control = run("control", [1.0] * LONG, units=units, **changes)
    for target, gap in ((new, new_param_gap), (control, control_param_gap)):
        for k, record in enumerate(target.ranks[0].steps):
            record["param_norm"] *= 1 + gap(k)
    return old, new, control


def _checks(verdict) -> dict:
    return {c.name: c for c in verdict.checks}


def test_a_gap_that_wanders_like_the_controls_passes():
    old, new, control = _runs(lambda k: 3e-6 * (-1) ** k, lambda k: 2e-6 * (-1) ** (k + 1))
    checks = _checks(compare(old, new, None, control))
    assert checks["param norm"].passed and checks["drift"].passed


def test_a_gap_beyond_the_controls_largest_fails_at_that_step():
    old, new, control = _runs(lambda k: 3e-6 * (-1) ** k * (10 if k == LONG - 1 else 1), lambda k: 2e-6 * (-1) ** k)
    checks = _checks(compare(old, new, None, control))
    assert not checks["param norm"].passed and checks["param norm"].worst["step"] == LONG - 1


def test_a_steady_drift_one_way_fails_although_every_step_is_within_the_envelope():
    # The control wanders by 1e-6 with one excursion to 4e-6: a step may reach 5 x 4e-6, the mean 5 x ~1.1e-6.
    old, new, control = _runs(lambda k: 8e-6, lambda k: (4e-6 if k == LONG - 1 else 1e-6) * (-1) ** k)
    checks = _checks(compare(old, new, None, control))
    assert checks["param norm"].passed
    assert not checks["drift"].passed and "param norm +8e-06" in checks["drift"].summary
