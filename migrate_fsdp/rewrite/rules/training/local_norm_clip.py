"""MF218: `torch.nn.utils.clip_grad_norm_(model.parameters(), ...)` on an FSDP1 model clipped by this rank's norm.

FSDP1's `model.parameters()` outside forward are this rank's flat shards, so torch's function took the norm of the
rank's shard alone and each rank scaled its shard by its own factor (the reason FSDP1 has `model.clip_grad_norm_`).
FSDP2's are DTensors, and the same call takes the global norm: what the code was written for, and what FSDP1's
method gave. Where clipping is active, training changes from the first clipped step, so it is reported; the model
converts. A NO_SHARD model of the file is not: its parameters were whole on every rank.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.guards import in_summon
from migrate_fsdp.rewrite.analysis.parameter_loops import parameters_source
from migrate_fsdp.rewrite.rules.training.base import TrainingRule

_TORCH_CLIP = ("torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad.clip_grad_norm_", "torch.nn.utils.clip_grad_norm")


class LocalNormClip(TrainingRule):
    code = "MF218"
    name = "local-norm-clip"
    summary = "torch's clip_grad_norm_ of an FSDP1 model's parameters took this rank's norm; on FSDP2 the global one"
    reports_model_uses = False  # a heads-up on code that converts with its model: it holds nothing back
    heads_up = True
    tokens = ((b"clip_grad_norm",),)

    def leave_Call(self, original: cst.Call, updated):
        if not original.args or not self.ctx.matches(original.func, *_TORCH_CLIP) or in_summon(self.ctx, self.ctx.stack):
            return updated
        model = parameters_source(self.ctx, original.args[0].value)
        if model is None or not self.models.is_fsdp_model(model):
            return updated
        stack = tuple(self.ctx.stack)
        if self.ctx.program.use(model, self.code, stack) is not None:
            return updated  # the model stays FSDP1: the call means what it meant
        if self.ctx.program.replicated(model, stack):
            return updated  # NO_SHARD: FSDP1's parameters were whole, the rank's norm the global one
        self.ctx.report(
            original,
            self.code,
            f"`{self.ctx.code(original.func)}` of `{self.ctx.code(model)}`'s parameters: FSDP1's were this rank's "
            "flat shards, so each rank clipped by its own shard's norm; FSDP2's DTensors give the global norm "
            "(FSDP1's `model.clip_grad_norm_`), so training changes where clipping is active",
        )
        return updated
