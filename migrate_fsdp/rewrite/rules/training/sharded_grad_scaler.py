"""MF208: `ShardedGradScaler(...)` -> `torch.amp.GradScaler(...)`.

FSDP1's `ShardedGradScaler` (torch/distributed/fsdp/sharded_grad_scaler.py)
exists because each rank sees only its flat-parameter shard: it all-reduces
the found-inf flag over `process_group`. With FSDP2 the gradients are
DTensors and DTensor itself reduces that flag over the gradients' mesh
(`found_inf_reduce_handler` in torch/distributed/tensor/_dispatch.py), so
the plain `torch.amp.GradScaler` is the replacement and `process_group` goes.

The signatures differ in order: ShardedGradScaler takes `(device,
init_scale, backoff_factor, growth_factor, ...)`, GradScaler `(device,
init_scale, growth_factor, backoff_factor, ...)`, so positional arguments
after `init_scale` are passed by keyword. A `process_group` other than the
default (None / `dist.group.WORLD`) is reported: the FSDP2 scaler reduces
over the model's mesh, whatever group was given.
"""

import libcst as cst

from migrate_fsdp.rewrite.forward_refs import in_annotation, respell, spelled_fsdp1_names
from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, TrainingRule, bind

SCALER = "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler"
_PARAMS = ("device", "init_scale", "backoff_factor", "growth_factor", "growth_interval", "enabled", "process_group")
_KEEP_POSITIONAL = ("device", "init_scale")  # same place in both signatures
_DEFAULT_GROUPS = ("builtins.None", "torch.distributed.group.WORLD", "torch.distributed.distributed_c10d.group.WORLD")
_ADVICE = "use `torch.amp.GradScaler(device, ...)`: DTensor gradients reduce the found-inf flag over the model's mesh (FSDP2)"


class ShardedGradScaler(TrainingRule):
    code = "MF208"
    name = "sharded-grad-scaler"
    summary = "ShardedGradScaler(...) -> torch.amp.GradScaler(...)"
    tokens = (*FSDP2_TOKENS, b"ShardedGradScaler")

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if not self.ctx.matches(original.func, SCALER):
            return updated
        bound = bind(original, _PARAMS)
        if bound is None:
            self.ctx.report(original, self.code, "arguments not understood; " + _ADVICE)
            return updated
        group = bound.get("process_group")
        if group is not None and not self.ctx.matches(group.value, *_DEFAULT_GROUPS):
            self.ctx.report(original, self.code, "`process_group` is not the default group; " + _ADVICE)
            return updated
        if not self.fsdp2_ahead(original):
            return updated
        self.ctx.mark_handled(original.func)
        args = []
        for old, new in zip(original.args, updated.args, strict=True):
            if old is group:
                continue
            name = next(param for param, arg in bound.items() if arg is old)
            if new.keyword is None and name not in _KEEP_POSITIONAL:
                new = new.with_changes(
                    keyword=cst.Name(name),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                    ),
                )
            args.append(new)
        if args:
            args[-1] = args[-1].with_changes(comma=updated.args[-1].comma if group is None else cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(func=cst.Name(self._grad_scaler()), args=args)

    def leave_Name(self, original: cst.Name, updated):
        return self._reference(original, updated)

    def leave_Attribute(self, original: cst.Attribute, updated):
        return self._reference(original, updated)

    def _reference(self, original, updated):
        """The class named, not called: fine as a type (isinstance, annotations), reported otherwise."""
        if not self.ctx.matches(original, SCALER):
            return updated
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Call) and parent.func is original:
            return updated  # the call: leave_Call
        if not self.in_type_position():
            self.ctx.report(original, self.code, "`ShardedGradScaler` used as a value; " + _ADVICE)
            return updated
        if not self.fsdp2_ahead(original):
            return updated
        self.ctx.mark_handled(original)
        return cst.Name(self._grad_scaler())

    def leave_SimpleString(self, original: cst.SimpleString, updated):
        # `Optional["ShardedGradScaler"]`: the annotation converts with the scaler it describes.
        if not in_annotation(self.ctx.stack) or SCALER not in spelled_fsdp1_names(self.ctx, original):
            return updated
        if not self.fsdp2_ahead(original):
            return updated
        self.ctx.mark_handled(original)
        return respell(self.ctx, original, {SCALER: self._grad_scaler()})

    def _grad_scaler(self) -> str:
        return self.ctx.require_import("torch.amp", "GradScaler")
