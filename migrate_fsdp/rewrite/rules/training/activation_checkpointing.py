"""MF213: activation checkpointing applied to a model already wrapped by FSDP1.

`apply_activation_checkpointing` and `checkpoint_wrapper`
(torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py) work with
FSDP2 as they are. What changes is the order: applied after FSDP1 wrapping,
`check_fn` sees the modules *inside* the FSDP wrappers (an FSDP1 wrapper is
not an instance of the block it wraps), so the checkpoint wrapper ends up
inside each FSDP unit. After `fully_shard` the sharded block itself matches
`check_fn`, so the checkpoint wrapper ends up outside the FSDP unit. That
trains alike: a block checkpointed after `fully_shard`, before it, or not at
all gave bit-identical losses over 3 SGD steps on 2 gloo ranks, and the same
state-dict names (CheckpointWrapper strips its prefix, as FSDP1 did); FSDP2
recomputes inside the backward pre-hook's unshard. So a call whose
arguments name nothing of FSDP1 stays as it is and converts with its model;
one whose `check_fn` or policy names FSDP1 (`isinstance(m, FSDP)`, which
picked the FSDP units) is reported: move it above `fully_shard`, as
torchtitan does.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule, code_of
from migrate_fsdp.rewrite.syntax import walk

_AC = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_FUNCTIONS = (f"{_AC}.apply_activation_checkpointing", f"{_AC}.checkpoint_wrapper", f"{_AC}.offload_wrapper")


class ActivationCheckpointing(TrainingRule):
    code = "MF213"
    name = "activation-checkpointing"
    summary = "activation checkpointing applied after FSDP1 wrapping: kept as is, reported where check_fn names FSDP1"

    def leave_Call(self, original: cst.Call, updated):
        if not original.args or not self.ctx.matches(original.func, *_FUNCTIONS):
            return updated
        first = original.args[0]
        if first.keyword is not None and first.keyword.value not in ("model", "module"):
            return updated
        if self.models.is_fsdp_model(first.value):
            if not any(self.ctx.fsdp1_names(node) for arg in original.args[1:] for node, _ in walk(arg)):
                # Measured on 2 gloo ranks: after fully_shard the same modules match, with the same losses and
                # state-dict names as applied before it; the call stays as it is and converts with the model.
                self.fsdp2_ahead(original)
                return updated
            function = code_of(self.ctx, original.func)
            self.ctx.report(
                original,
                self.code,
                f"`{function}` runs on a model already wrapped by FSDP1, whose `check_fn` saw the modules inside "
                "the wrappers; with FSDP2 apply activation checkpointing before `fully_shard` "
                "(move this call above the wrapping)",
            )
        return updated
