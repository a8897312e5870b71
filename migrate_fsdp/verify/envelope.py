"""The long-run verdict: the new version's gaps to the old one, judged against a control run's.

The first-order bound of `tolerance` holds for the first few updates; past
them it is both unsafe (AdamW's normalisation and active clipping amplify a
gap more than first order: a correct bf16 migration left its loss bound at
step 12) and loose (it adds a worst-case eps per step: over 200 bf16 steps it
let a 1% different learning rate pass). So a non-exact pair that runs longer
than EARLY_STEPS gets a control run: the old version again, its gradients
perturbed before each update by noise of the size of the detected rounding
causes (perturb.py). The control's gap to the old run is how this training
amplifies rounding; the new version's gap must stay within FACTOR times it:

* at every step k >= EARLY_STEPS, for the loss of each rank and for the
  gradient, parameter and clip norms: |new - old| <= FACTOR * (the largest
  gap of that quantity in the control from EARLY_STEPS on), or the
  quantity's own floor (one unit in the last place of the loss's dtype; the
  float64 norm summation bound; the clip norm's summation bound). The whole
  late trajectory's largest gap, not the control's largest so far: a single
  control wanders near zero for stretches, which a correct migration that
  took its first rounding kick earlier would fail against;
* over the whole trajectory from EARLY_STEPS on (`drift`): |mean of the
  signed gaps| <= FACTOR * (root mean square of the control's gaps). Rounding
  noise wanders; a wrong learning rate, weight decay or loss scale pushes
  the gap steadily one way, and its mean grows with the run where noise's
  does not outgrow its own spread.

FACTOR = 5: a control and a correct migration are two draws of the same kind
of rounding noise, and their gaps differ by the chance of each draw. Measured
on the 200-step bf16 + accumulation + clipping test script
(tests/verify/scripts/long_bf16) with six control seeds, the largest late
parameter-norm gap of a control ranged from 4.2e-5 to 1.1e-4 (a spread of
2.6x); the correct migration's was 1.1e-4 (1.0x to 2.6x a control's), a
learning rate 1% larger's 8.7e-4 (8x to 21x). 5 sits between those, near
their geometric middle, so that neither margin is thin: the correct
migration used at most 52% of its bounds, the wrong learning rate exceeded
them by 1.6x or more (docs/verify.md has the figures).
"""

import math

from migrate_fsdp.verify.tolerance import FLOAT64_U, clip_rounding, unit_roundoff

EARLY_STEPS = 8  # steps judged by the first-order bound alone; a longer non-exact pair gets a control run
FACTOR = 5.0
QUANTITIES = ("loss", "grad norm", "param norm", "clip norm")


def gaps(old_run, other_run, steps: int) -> dict:
    """Per quantity, per step: the signed gaps of `other_run` to `old_run` (loss: one per rank, absolute;
    norms: relative, from the first rank, being global)."""
    out = {name: [[] for _ in range(steps)] for name in QUANTITIES}
    for old_rank, other_rank in zip(old_run.ranks, other_run.ranks):
        for k, (a, b) in enumerate(zip(old_rank.steps[:steps], other_rank.steps[:steps])):
            if a["loss"] is not None and b["loss"] is not None:
                out["loss"][k].append(b["loss"] - a["loss"])
            if old_rank is not old_run.ranks[0]:
                continue
            out["grad norm"][k].append(_relative(a["grad_norm"], b["grad_norm"]))
            out["param norm"][k].append(_relative(a["param_norm"], b["param_norm"]))
            if a.get("clip") and b.get("clip"):
                out["clip norm"][k].append(_relative(a["clip"]["total_norm"], b["clip"]["total_norm"]))
    return out


def _relative(old: float, new: float) -> float:
    return (new - old) / abs(old) if old else new - old


class Envelope:
    """How far the control run strayed from the old one over the long run (the steps from EARLY_STEPS on)."""

    def __init__(self, control_gaps: dict):
        self.largest = {}  # name -> the largest |gap|
        self.spread = {}  # name -> the root mean square of the gaps
        for name, per_step in control_gaps.items():
            late = [v for values in per_step[EARLY_STEPS:] for v in values]
            self.largest[name] = max((abs(v) for v in late), default=0.0)
            self.spread[name] = math.sqrt(sum(v * v for v in late) / len(late)) if late else 0.0

    def bound(self, name: str, floor: float) -> float:
        """What a gap of the new version may reach at any step from EARLY_STEPS on."""
        return max(FACTOR * self.largest.get(name, 0.0), floor)


def loss_floor(loss_abs: float, loss_dtype: str | None) -> float:
    """One unit in the last place of the loss's own dtype: values rounded from slightly different inputs."""
    return 2 * unit_roundoff(loss_dtype) * loss_abs


def norm_floor(numel: int) -> float:
    return numel * FLOAT64_U


def drift(name: str, new_gaps: list, envelope: Envelope, floor: float):
    """(passed, mean signed gap, its bound) over the steps from EARLY_STEPS on; None with nothing to judge."""
    late = [v for values in new_gaps[EARLY_STEPS:] for v in values]
    if not late:
        return None
    mean = sum(late) / len(late)
    bound = max(FACTOR * envelope.spread.get(name, 0.0), floor)
    return abs(mean) <= bound, mean, bound


def control_perturbation(setting, old_steps: list, steps: int) -> str | None:
    """The control run's perturbation (perturb.ENV's value), or None when the pair needs no control:
    an exact setting (bit-identical is the verdict) or a run no longer than EARLY_STEPS."""
    from migrate_fsdp.verify.perturb import encode

    if setting.exact or steps <= EARLY_STEPS:
        return None
    clipped = next((s for s in old_steps if s.get("clip")), None)
    scale = clip_rounding(setting, clipped["grad_numel"], clipped["clip"]["dtype"]) if clipped else 0.0
    return encode(setting.reduction_order + setting.accumulation, scale)
