"""MF215: the shape of a parameter of an FSDP model that converts, read after wrapping: it changes.

FSDP1 showed its parameters outside forward flattened: one 1-D FlatParameter
per unit (use_orig_params=False), or each parameter as a 1-D view of this
rank's shard (use_orig_params=True with a strategy that shards). FSDP2's
DTensor parameters keep their shapes. So `p.ndim >= 2`, `p.dim()`,
`p.shape`, `p.size()` of `model.parameters()` taken after wrapping answer
otherwise once the model converts: the usual weight-decay groups
(`[p for p in model.parameters() if p.ndim >= 2]`) picked nothing under
FSDP1 and pick the weights under FSDP2, and training changes from the first
step. The model still converts (FSDP2's answer is what the code was written
for); the read is reported so that the change is seen where it happens.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule
from migrate_fsdp.rewrite.rules.training.summon_full_params import SUMMON_FULL_PARAMS

_SHAPE_ATTRIBUTES = ("ndim", "shape")
_SHAPE_METHODS = ("dim", "size")
_PARAMETER_READS = ("parameters", "named_parameters")
_LOOPS = (cst.CompFor, cst.For)


class ParameterShapes(TrainingRule):
    code = "MF215"
    name = "parameter-shapes"
    summary = "p.ndim / p.dim() / p.shape of an FSDP model's parameters after wrapping: FSDP1's were flat, reported"
    reports_model_uses = False  # a heads-up on code that converts with its model: it holds nothing back

    def leave_Attribute(self, original: cst.Attribute, updated):
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        method = isinstance(parent, cst.Call) and parent.func is original and original.attr.value in _SHAPE_METHODS
        if original.attr.value in _SHAPE_ATTRIBUTES or method:
            self._check(original, self.ctx.code(original) + ("()" if method else ""))
        return updated

    def _check(self, read: cst.Attribute, shown: str) -> None:
        if not isinstance(read.value, cst.Name) or self._in_full_parameters():
            return
        model = self._model_iterated(read.value.value)
        if model is None or not self.models.is_fsdp_model(model):
            return
        if self.ctx.program.use(model, self.code, tuple(self.ctx.stack)) is not None:
            return  # the model stays FSDP1 (or is FSDP2's already): the read answers as before
        self.ctx.report(
            read,
            self.code,
            f"`{shown}` of a parameter of `{self.ctx.code(model)}`: FSDP1's parameters were flat (1-D) "
            "here, FSDP2's keep their shapes, so what this picks changes (weight-decay groups now get the weights)",
        )

    def _in_full_parameters(self) -> bool:
        """Under `with FSDP.summon_full_params(...)`, where FSDP1's parameters had their shapes too."""
        return any(
            isinstance(node, cst.With)
            and any(isinstance(item.item, cst.Call) and self.ctx.matches(item.item.func, SUMMON_FULL_PARAMS) for item in node.items)
            for node in self.ctx.stack
        )

    def _model_iterated(self, name: str) -> cst.BaseExpression | None:
        """The model whose `parameters()` / `named_parameters()` the innermost loop binding `name` walks."""
        for node in reversed(self.ctx.stack):
            if not isinstance(node, _LOOPS) or not _binds(node.target, name):
                continue
            call = node.iter
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in _PARAMETER_READS:
                return call.func.value
            return None
        return None


def _binds(target: cst.BaseExpression, name: str) -> bool:
    """`for p in ...` or `for n, p in ...` binds `name` to the parameter."""
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        last = target.elements[1].value
        return isinstance(last, cst.Name) and last.value == name
    return False
