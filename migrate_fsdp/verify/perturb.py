"""The control run's perturbation: rounding-sized noise on the old version's own gradients.

A training that is not bit-exact between the two versions differs, every
step, by rounding: FSDP1 accumulating micro-batches in bf16 where FSDP2 uses
fp32, collectives summing in another order, clip coefficients computed from
differently ordered sums (tolerance.detect finds which). How far such gaps
grow depends on the training: AdamW's normalisation, active clipping and
chaotic dynamics amplify them, and no a-priori bound is both safe and tight
over hundreds of steps. So verify measures it: it runs the old version once
more with the probe adding noise of the size of the detected causes to the
gradients before each optimizer step, and the gap between that control and
the old run is the envelope the new version must stay within (compare.py).

The noise, at the step `k` and for each gradient element g:
g * (1 + elementwise * r), r uniform in [-1, 1], drawn from a generator seeded
with k (and the control's seed) only, so that replicas (NO_SHARD, HSDP) receive the same noise and stay
replicas. The probe applies it before the optimizer step, after any clipping;
on a step whose clipping was active, the rounding would have come before the
clip, which sets the norm, so the noisy gradients are scaled back to the
clipped norm, and then by 1 + scale * s (one s uniform in [-1, 1] per step),
the way a clip coefficient from a differently ordered sum would scale them.
"""

import json

import torch

ENV = "MIGRATE_FSDP_VERIFY_PERTURB"  # JSON {"elementwise": e, "scale": s, "seed": n}; unset: no perturbation


def encode(elementwise: float, scale: float, seed: int = 0) -> str:
    return json.dumps({"elementwise": elementwise, "scale": scale, "seed": seed})


class Perturbation:
    def __init__(self, spec: str):
        fields = json.loads(spec)
        self.elementwise = float(fields.get("elementwise", 0.0))
        self.scale = float(fields.get("scale", 0.0))
        self.seed = int(fields.get("seed", 0))

    @torch.no_grad()
    def apply(self, params: list, step: int, clipped: bool, global_norm) -> None:
        """Perturb the gradients of `params` in place; global_norm(): their norm over all ranks."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        grads = [g for g in (_local(p.grad) for p in params if p.grad is not None) if g.numel()]
        clipped_norm = global_norm() if clipped else None
        for grad in grads:
            signs = torch.randint(2, grad.shape, generator=generator, dtype=torch.float64).mul_(2).sub_(1)
            factor = signs.mul_(self.elementwise).add_(1.0).to(grad.device)
            grad.copy_(grad.double().mul_(factor).to(grad.dtype))
        if clipped_norm is None:
            return
        factor = 1.0 + self.scale * (2 * torch.rand((), generator=generator, dtype=torch.float64).item() - 1)
        noisy_norm = global_norm()
        factor *= clipped_norm / noisy_norm if noisy_norm else 1.0
        for grad in grads:
            grad.mul_(factor)


def _local(grad):
    """The tensor this rank holds: a DTensor's local shard (a view: writing to it writes the gradient)."""
    return grad.to_local() if hasattr(grad, "to_local") else grad
