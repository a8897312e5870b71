"""MF205: `model.clip_grad_norm_(max_norm, norm_type)` -> `torch.nn.utils.clip_grad_norm_`.

FSDP2 has no `clip_grad_norm_` method: parameters and gradients are DTensors,
and `torch.nn.utils.clip_grad_norm_` computes the global norm across shards
by itself (/work/shared/seeds/002, "Gradient Clipping and Optimizer with
DTensor"). Its return value is then a DTensor, where FSDP1's method
(fully_sharded_data_parallel.py) returned a plain tensor holding the global
norm. When the caller uses the value, the rewrite calls a small helper that
returns `full_tensor()` of it, so logging, `.item()`, comparisons with plain
tensors and `torch.isfinite` keep working as before; a bare statement calls
torch's function directly.

The two norms agree to rounding: FSDP1 sums squares over its flat-parameter
shards, DTensor per parameter shard, so the float sums associate differently
and may differ in the last bit (docs/rules/MF205.md).

`clip_grad_norm_` of a user's own class, of accelerate's `Accelerator`
(`clip_grad_norm_(parameters, max_norm)`) or of anything shown not to be an
FSDP1 model is left alone. A call shaped like FSDP1's on a receiver of unknown
type (`for v in model.student.values(): v.clip_grad_norm_(3.0)`) takes a
helper that clips an FSDP2 module and calls any other module's own method,
where an FSDP1 model that converts may reach the file; elsewhere it is
reported.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, TrainingRule, bind, code_of
from migrate_fsdp.rewrite.analysis.models import Kind


HELPER_NAME = "fsdp2_clip_grad_norm_"
ANY_MODULE_HELPER = "fsdp2_module_clip_grad_norm_"
_PARAMS = ("max_norm", "norm_type")
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


class ClipGradNorm(TrainingRule):
    code = "MF205"
    name = "clip-grad-norm"
    summary = "model.clip_grad_norm_(...) -> torch.nn.utils.clip_grad_norm_(model.parameters(), ...)"
    tokens = (*FSDP2_TOKENS, b".clip_grad_norm_(")  # a shared training step may name no FSDP at all

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if self.fsdp_method(func) == "clip_grad_norm_":  # FSDP.clip_grad_norm_(model, max_norm)
            bound = bind(original, ("self", *_PARAMS))
            if bound is None or "self" not in bound or "max_norm" not in bound:
                self.ctx.report(original, self.code, self._advice())
                return updated
            if not self.fsdp2_ahead(original):
                return updated
            self.ctx.mark_handled(func)
            model = updated.args[original.args.index(bound["self"])].value
            rest = [a for o, a in zip(original.args, updated.args, strict=True) if o is not bound["self"]]
            return self._build(model, rest)
        if self.model_method(func, "clip_grad_norm_") is None:
            return updated
        bound = bind(original, _PARAMS)
        kind = self.model_method_receiver_kind(func)
        if kind is Kind.FSDP and bound is not None and "max_norm" in bound:
            if not self.fsdp2_ahead(original):
                return updated
            return self._build(updated.func.value, list(updated.args))
        receiver = code_of(self.ctx, func.value)
        if kind is Kind.FSDP:
            self.ctx.report(func, self.code, "arguments not understood; " + self._advice(receiver))
        elif kind is Kind.UNKNOWN and self._shaped_like_fsdp1(original) and self.ctx.program.may_build_fsdp1():
            program = self.ctx.program
            if not self.ctx.dual_versions.holds(self.ctx.stack):
                program.use(original, self.code, tuple(self.ctx.stack), dispatchable=True)
                if program.traced(original):  # every model reaching it converts: FSDP2's form, as for a known model
                    return self._build(updated.func.value, list(updated.args))
                if program.dispatch(func):
                    helper = self.ctx.add_helper(ANY_MODULE_HELPER)
                    return cst.Call(func=cst.Name(helper), args=[cst.Arg(updated.func.value, comma=_COMMA), *updated.args])
            self.ctx.report(
                func, self.code, f"cannot tell whether `{receiver}` is an FSDP1 model; " + self._advice(receiver), unsure=True
            )
        return updated

    @staticmethod
    def _shaped_like_fsdp1(call: cst.Call) -> bool:
        """`(max_norm[, norm_type])`, not accelerate's `(parameters, max_norm)`."""
        if bind(call, _PARAMS) is None:
            return False
        positional = [a for a in call.args if a.keyword is None]
        return len(positional) <= 1 or isinstance(positional[0].value, cst.BaseNumber)

    def _build(self, model: cst.BaseExpression, args: list) -> cst.Call:
        parameters = cst.Call(func=cst.Attribute(value=model, attr=cst.Name("parameters")))
        comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args = [cst.Arg(parameters, comma=comma), *args]
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        clip = self.ctx.require_import("torch.nn.utils", "clip_grad_norm_")
        if self.is_statement_call():
            return cst.Call(func=cst.Name(clip), args=args)
        helper = self.ctx.add_helper(HELPER_NAME)
        return cst.Call(func=cst.Name(helper), args=args)

    @staticmethod
    def _advice(receiver: str = "model") -> str:
        return (
            f"for an FSDP1 model use `torch.nn.utils.clip_grad_norm_({receiver}.parameters(), max_norm, norm_type)` "
            "and `.full_tensor()` on the returned DTensor norm (FSDP2)"
        )
