"""How far apart the two versions may be, derived from what the probe observed.

The model (docs/verify.md, "Tolerances", says the same for users):

* Bit-exact is the default. On the same data, FSDP1 and FSDP2 run the same
  kernels on the same values; the only freedom is the order of the gradient
  reduction, and a sum of two terms is the same in either order. So at world
  size 2 on CPU, in fp32 and in bf16 MixedPrecision alike, every loss and every
  gradient and parameter bit must agree (checked through an order-free digest).

* Three observed things make the versions round differently. Each perturbs an
  optimizer update by a relative amount eps, bounded by the standard forward
  error of a sum of n terms in unit roundoff u (|error| <= n*u*sum|x|):
    - reduction order: where a gradient collective sums G >= 3 contributions
      (G: the largest shard or replicate group; 2-D meshes of 2 x 2 stay
      exact), the versions may add them in another order: eps = 2 (G-1) u_reduce;
    - low-precision gradient accumulation: over m micro-batches without sync,
      FSDP1 adds the unsharded gradients in the parameter dtype (bf16) while
      FSDP2 upcasts to its reduce dtype first:
      eps = (m-1) (u_fsdp1_accum + u_fsdp2_accum), when those dtypes differ;
    - gradient clipping that is active: the two versions sum the squares in
      another order, and the clip coefficient differs by the relative
      difference of the two total norms, which the probe records exactly:
      eps = |N_old - N_new| / N_old for that step.
* First-order propagation with gain 1: a relative perturbation eps_i of update
  i perturbs every later quantity by at most eps_i, relatively; perturbations
  add. With E_k = sum of eps_i over the updates that precede quantity k:
    - loss of step k (before update k): |d| <= (E_k + 2 u_loss) sum|loss|,
      where 2 u_loss is one unit in the last place of the loss's own dtype, as
      soon as E_k > 0 (the value rounded from slightly different inputs can
      land one ulp away);
    - gradient norm of step k (after its reduction, and clipping):
      relative |d| <= E_k + eps_k;
    - parameter norm after update k: relative |d| <= E_k + eps_k;
    - the clip total norm of step k: relative |d| <= E_k + r + a + 2 u (ceil(log2 n) + W):
      it is computed from gradients that already carry this step's reduction
      order (r) and accumulation (a) perturbations, plus the error of two fp32
      pairwise sums of n squares and W shard totals.
  This bound is trusted for the first envelope.EARLY_STEPS steps only; a
  longer pair that is not exact is judged against a control run (envelope.py).
  Norms are computed by the probe in float64 over shards laid out differently
  by the two versions, so they also carry n * 2**-53 (n = number of elements).
"""

import math
from dataclasses import dataclass, field

UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}
FLOAT64_U = UNIT_ROUNDOFF["float64"]


def unit_roundoff(dtype: str | None) -> float:
    return UNIT_ROUNDOFF.get(dtype or "float32", UNIT_ROUNDOFF["float32"])


@dataclass
class Setting:
    """The numerical setting of a pair of runs and the perturbation each step's update received."""

    world_size: int
    device: str
    reduction_order: float = 0.0
    accumulation: float = 0.0
    clipping: list = field(default_factory=list)  # per step
    notes: list = field(default_factory=list)

    def eps(self, step: int) -> float:
        clip = self.clipping[step] if step < len(self.clipping) else 0.0
        return self.reduction_order + self.accumulation + clip

    def before(self, step: int) -> float:
        """E_k: the perturbation accumulated by the updates that ran before step k."""
        return sum(self.eps(i) for i in range(step))

    @property
    def exact(self) -> bool:
        return self.reduction_order == 0 and self.accumulation == 0 and not any(self.clipping)

    def label(self) -> str:
        if self.exact:
            return "bit-exact"
        parts = []
        if self.reduction_order:
            parts.append(f"reduction order: eps {self.reduction_order:.2e}/step")
        if self.accumulation:
            parts.append(f"low-precision accumulation: eps {self.accumulation:.2e}/step")
        if any(self.clipping):
            parts.append(f"clipping: eps up to {max(self.clipping):.2e}/step")
        return "; ".join(parts)


def _accumulate_dtype(unit: dict) -> str | None:
    """FSDP1 accumulates unsynced gradients in the parameter dtype, FSDP2 in its reduce dtype."""
    return unit.get("param_dtype") if unit.get("origin", "").startswith("FSDP1") else unit.get("reduce_dtype")


def _coarsest(units, dtype_of) -> str | None:
    """The dtype with the largest unit roundoff among the units' dtypes."""
    dtypes = [dtype_of(u) for u in units if dtype_of(u)]
    return max(dtypes, key=unit_roundoff, default=None)


def clip_perturbations(old_steps: list, new_steps: list) -> list:
    out = []
    for old, new in zip(old_steps, new_steps):
        a, b = old.get("clip"), new.get("clip")
        active = any(c and c["total_norm"] + 1e-6 > c["max_norm"] for c in (a, b))
        if not (a and b and active):
            out.append(0.0)
            continue
        out.append(abs(a["total_norm"] - b["total_norm"]) / a["total_norm"] if a["total_norm"] else 0.0)
    return out


def _all_units(setups: list) -> dict:
    return {(index, fqn): unit for index, setup in enumerate(setups) for fqn, unit in setup["units"].items()}


def detect(old_setups: list, new_setups: list, old_steps: list, new_steps: list) -> Setting:
    """Work out the setting from both runs' setup records (one per optimizer) and step records (one rank's)."""
    first = (old_setups or new_setups or [{}])[0]
    world = first.get("world_size", 1)
    setting = Setting(world_size=world, device=first.get("device", "cpu"))
    old_units, new_units = _all_units(old_setups), _all_units(new_setups)
    units = list(old_units.values()) + list(new_units.values())
    group = max((u.get(k) or 1 for u in units for k in ("shard_size", "replicate_size")), default=world)
    if group >= 3:
        reduce_dtype = _coarsest(units, lambda u: u.get("reduce_dtype"))
        setting.reduction_order = 2 * (group - 1) * unit_roundoff(reduce_dtype)
        setting.notes.append(f"gradient collectives sum {group} contributions, in an order each version picks")
    unsynced = max((s.get("unsynced_backwards", 0) for s in old_steps + new_steps), default=0)
    acc_old = _coarsest(old_units.values(), _accumulate_dtype)
    acc_new = _coarsest(new_units.values(), _accumulate_dtype)
    if unsynced and acc_old != acc_new:
        setting.accumulation = unsynced * (unit_roundoff(acc_old) + unit_roundoff(acc_new))
        setting.notes.append(
            f"gradients of {unsynced + 1} micro-batches are accumulated without sync in {acc_old} by the old "
            f"version and in {acc_new} by the new one"
        )
    setting.clipping = clip_perturbations(old_steps, new_steps)
    if any(setting.clipping):
        setting.notes.append("gradient clipping scales each update by a coefficient computed from differently "
                             "ordered sums")
    return setting


def loss_tolerance(setting: Setting, step: int, loss_abs: float, loss_dtype: str | None) -> float:
    before = setting.before(step)
    if before == 0:
        return 0.0
    return (before + 2 * unit_roundoff(loss_dtype)) * loss_abs


def norm_rtol(setting: Setting, step: int, numel: int) -> float:
    return setting.before(step) + setting.eps(step) + numel * FLOAT64_U


def clip_rounding(setting: Setting, numel: int, dtype: str | None) -> float:
    """How far two differently ordered sums of the squares of n gradient elements (and W shard totals) may be."""
    return 2 * unit_roundoff(dtype) * (math.ceil(math.log2(max(numel, 2))) + setting.world_size)


def clip_rtol(setting: Setting, step: int, numel: int, dtype: str | None) -> float:
    this_step = setting.reduction_order + setting.accumulation  # already in the gradients the norm is taken of
    return setting.before(step) + this_step + clip_rounding(setting, numel, dtype)
