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

An `auto_wrap_policy` picking blocks by class (`ModuleWrapPolicy({Block})`,
`partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})`, as
torchtune passes) becomes the `check_fn` that picks the same modules
(`_recursive_wrap` with `only_wrap_children`, the root excluded either way):
`check_fn=lambda module: isinstance(module, (Block,))`. With a policy,
apply_activation_checkpointing ignored `check_fn`; one given beside it goes.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import expression
from migrate_fsdp.rewrite.rules.training.base import TrainingRule, code_of
from migrate_fsdp.rewrite.syntax import subtree_ids, walk

_AC = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
_WRAP = "torch.distributed.fsdp.wrap"
_FUNCTIONS = (f"{_AC}.apply_activation_checkpointing", f"{_AC}.checkpoint_wrapper", f"{_AC}.offload_wrapper")


class ActivationCheckpointing(TrainingRule):
    code = "MF213"
    name = "activation-checkpointing"
    summary = "activation checkpointing applied after FSDP1 wrapping: kept as is, reported where check_fn names FSDP1"

    def collect_Call(self, node: cst.Call) -> None:
        super().collect_Call(node)
        policy = self._class_policy(node)
        if policy is not None:
            self.ctx.mark_handled(policy)  # it becomes a check_fn with the call, or stays with the model

    def leave_Call(self, original: cst.Call, updated):
        if not original.args or not self.ctx.matches(original.func, *_FUNCTIONS):
            return updated
        first = original.args[0]
        if first.keyword is not None and first.keyword.value not in ("model", "module"):
            return updated
        if self.models.is_fsdp_model(first.value):
            policy = self._class_policy(original)
            converted = subtree_ids(policy) if policy is not None else set()
            if not any(
                self.ctx.fsdp1_names(node) for arg in original.args[1:] for node, _ in walk(arg) if id(node) not in converted
            ):
                # Measured on 2 gloo ranks: after fully_shard the same modules match, with the same losses and
                # state-dict names as applied before it; the call stays as it is and converts with the model.
                if self.fsdp2_ahead(original) and policy is not None:
                    return self._with_check_fn(original, updated, policy)
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

    def _class_policy(self, call: cst.Call) -> cst.Arg | None:
        """`auto_wrap_policy=` of an `apply_activation_checkpointing` call when it picks modules by class."""
        if not self.ctx.matches(call.func, f"{_AC}.apply_activation_checkpointing"):
            return None
        arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == "auto_wrap_policy"), None)
        return arg if arg is not None and self._classes(arg.value) is not None else None

    def _classes(self, policy) -> cst.BaseExpression | None:
        """The classes `ModuleWrapPolicy(C)` or `partial(transformer_auto_wrap_policy, transformer_layer_cls=C)` picks."""
        if not isinstance(policy, cst.Call):
            return None
        if self.ctx.matches(policy.func, f"{_WRAP}.ModuleWrapPolicy") and len(policy.args) == 1 and not policy.args[0].keyword:
            return policy.args[0].value
        if self.ctx.matches(policy.func, "functools.partial") and policy.args:
            if self.ctx.matches(policy.args[0].value, f"{_WRAP}.transformer_auto_wrap_policy"):
                rest = policy.args[1:]
                if len(rest) == 1 and rest[0].keyword is not None and rest[0].keyword.value == "transformer_layer_cls":
                    return rest[0].value
        return None

    def _with_check_fn(self, original: cst.Call, updated: cst.Call, policy: cst.Arg) -> cst.Call:
        classes = self._classes(policy.value)
        if isinstance(classes, (cst.Set, cst.List, cst.Tuple)) and classes.elements:
            picked = cst.Tuple([cst.Element(e.value) for e in classes.elements])
        else:
            picked = expression("tuple(CLASSES)", CLASSES=classes)
        check = expression("lambda module: isinstance(module, CLASSES)", CLASSES=picked)
        args = []
        for old, new in zip(original.args, updated.args, strict=True):
            if old is policy:
                args.append(new.with_changes(keyword=cst.Name("check_fn"), value=check))
            elif not (old.keyword is not None and old.keyword.value == "check_fn"):  # ignored beside a policy
                args.append(new)
        if args[-1].comma is not cst.MaybeSentinel.DEFAULT and not isinstance(args[-1].comma, cst.Comma):
            args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=args)
