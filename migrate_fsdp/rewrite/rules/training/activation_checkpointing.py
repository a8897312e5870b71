"""MF213: activation checkpointing applied to a model already wrapped by FSDP1.

`apply_activation_checkpointing` and `checkpoint_wrapper`
(torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py) work with
FSDP2 as they are. What changes is the order: applied after FSDP1 wrapping,
`check_fn` sees the modules *inside* the FSDP wrappers (an FSDP1 wrapper is
not an instance of the block it wraps), so the checkpoint wrapper ends up
inside each FSDP unit. After `fully_shard` the sharded block itself matches
`check_fn`, so the checkpoint wrapper would end up outside the FSDP unit,
with different recomputation and state-dict names. FSDP2 code applies
activation checkpointing before `fully_shard` (as torchtitan does); moving
the call is left to the user, who sees where it belongs.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule, code_of

_AC = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_FUNCTIONS = (f"{_AC}.apply_activation_checkpointing", f"{_AC}.checkpoint_wrapper", f"{_AC}.offload_wrapper")


class ActivationCheckpointing(TrainingRule):
    code = "MF213"
    name = "activation-checkpointing"
    summary = "activation checkpointing applied after FSDP1 wrapping reported: apply it before fully_shard"

    def leave_Call(self, original: cst.Call, updated):
        if not original.args or not self.ctx.matches(original.func, *_FUNCTIONS):
            return updated
        first = original.args[0]
        if first.keyword is not None and first.keyword.value not in ("model", "module"):
            return updated
        if self.models.is_fsdp_model(first.value):
            function = code_of(self.ctx, original.func)
            self.ctx.report(
                original,
                self.code,
                f"`{function}` runs on a model already wrapped by FSDP1, whose `check_fn` saw the modules inside "
                "the wrappers; with FSDP2 apply activation checkpointing before `fully_shard` "
                "(move this call above the wrapping)",
            )
        return updated
