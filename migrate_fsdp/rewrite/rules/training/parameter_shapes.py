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

from migrate_fsdp.rewrite.analysis.guards import in_summon
from migrate_fsdp.rewrite.analysis.models import PARAMETER_READS, method_owner
from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, TrainingRule
from migrate_fsdp.rewrite.syntax import walk

_SHAPE_ATTRIBUTES = ("ndim", "shape")
_SHAPE_METHODS = ("dim", "size")
_DICT_VIEWS = ("items", "values")
_LOOPS = (cst.CompFor, cst.For)


class ParameterShapes(TrainingRule):
    code = "MF215"
    name = "parameter-shapes"
    summary = "p.ndim / p.dim() / p.shape of an FSDP model's parameters after wrapping: FSDP1's were flat, reported"
    reports_model_uses = False  # a heads-up on code that converts with its model: it holds nothing back
    # Optimizer helpers live in modules that may name no FSDP (nanoGPT's configure_optimizers); they speak of
    # weight decay, which keeps the byte prefilter from parsing every module that reads a parameter's shape.
    tokens = (
        *FSDP2_TOKENS,
        *((b"parameters(", read, b"weight_decay") for read in (b".ndim", b".dim()", b".shape", b".size()")),
    )

    def leave_Attribute(self, original: cst.Attribute, updated):
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        method = isinstance(parent, cst.Call) and parent.func is original and original.attr.value in _SHAPE_METHODS
        if original.attr.value in _SHAPE_ATTRIBUTES or method:
            self._check(original, self.ctx.code(original) + ("()" if method else ""))
        return updated

    def _check(self, read: cst.Attribute, shown: str) -> None:
        if not isinstance(read.value, cst.Name) or in_summon(self.ctx, self.ctx.stack):  # full parameters there
            return
        model = self._model_iterated(read.value.value)
        if model is None:
            return
        if self.models.is_fsdp_model(model):
            if self.ctx.program.use(model, self.code, tuple(self.ctx.stack)) is not None:
                return  # the model stays FSDP1 (or is FSDP2's already): the read answers as before
        elif not (self._handed_in(model) and self._collects() and self.ctx.program.may_build_fsdp1()):
            return
        elif not (self._own_method(model) or self.ctx.program.dispatch(read)):
            return  # a module of unknown origin is reported where an FSDP1 model that converts may reach it (a
            # helper's `model` argument), or in a module's own method, which FSDP1 forwarded to from the wrapper
            # (`model.configure_optimizers()`) wherever the class is defined
        self.ctx.report(
            read,
            self.code,
            f"`{shown}` of a parameter of `{self.ctx.code(model)}`: FSDP1's parameters were flat (1-D) "
            "here, FSDP2's keep their shapes, so what this picks changes (weight-decay groups now get the weights)",
        )

    def _collects(self) -> bool:
        """The read picks parameters into a collection (a comprehension, or a loop appending them), as optimizer
        groups do; an initialisation loop (`if p.dim() > 1: nn.init.xavier_uniform_(p)`, run before wrapping) does
        not."""
        for node in reversed(self.ctx.stack):
            if isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
                return True
            if isinstance(node, cst.For):
                return any(
                    isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "append"
                    for call, _ in walk(node.body)
                )
        return False

    def _own_method(self, model) -> bool:
        """`model` is the `self` of an instance method, or of a function written to be one (`def
        configure_optimizers(self, ...)` at module level, attached to the class elsewhere)."""
        stack = self.ctx.stack
        function = next((n for n in reversed(stack) if isinstance(n, cst.FunctionDef)), None)
        params = function.params.params if function is not None else ()
        if not params or not isinstance(model, cst.Name) or params[0].name.value != model.value:
            return False
        return model.value == "self" or method_owner(function, stack[: stack.index(function) + 1]) is not None

    def _handed_in(self, model) -> bool:
        """`model` is an argument of the function around (`self` included): a module this code is handed."""
        scope = self.ctx.scope(model) if isinstance(model, cst.Name) else None
        if scope is None:
            return False
        bindings = scope[model.value]
        return bool(bindings) and all(isinstance(getattr(b, "node", None), cst.Param) for b in bindings)

    def _model_iterated(self, name: str) -> cst.BaseExpression | None:
        """The model whose `parameters()` / `named_parameters()` the innermost loop binding `name` walks, directly
        or through a dict of them (nanoGPT's `param_dict = {n: p for n, p in self.named_parameters()}` then
        `param_dict.items()`)."""
        for node in reversed(self.ctx.stack):
            if not isinstance(node, _LOOPS) or not _binds(node.target, name):
                continue
            return self._parameters_of(node.iter)
        return None

    def _parameters_of(self, iterated, through_dict: bool = True) -> cst.BaseExpression | None:
        call = iterated
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
            return None
        if call.func.attr.value in PARAMETER_READS:
            return call.func.value
        if call.func.attr.value in _DICT_VIEWS and through_dict and isinstance(call.func.value, cst.Name):
            return self._table_of_parameters(call.func.value)
        return None

    def _table_of_parameters(self, name: cst.Name) -> cst.BaseExpression | None:
        """The model whose parameters the dict `name` of the function around holds: built from them once
        (`{n: p for n, p in model.named_parameters()}`, `dict(model.named_parameters())`), and otherwise only
        filtered from itself (nanoGPT's `param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}`)."""
        function = next((n for n in reversed(self.ctx.stack) if isinstance(n, (cst.FunctionDef, cst.Module))), None)
        values = [
            node.value
            for node, _ in walk(function.body if isinstance(function, cst.FunctionDef) else function)
            if isinstance(node, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name.value for t in node.targets)
        ]
        models = []
        for value in values:
            if isinstance(value, cst.DictComp):
                source = value.for_in.iter
            elif isinstance(value, cst.Call) and self.ctx.matches(value.func, "builtins.dict") and len(value.args) == 1:
                source = value.args[0].value
            else:
                return None
            func = source.func if isinstance(source, cst.Call) else None
            if isinstance(func, cst.Attribute) and func.attr.value in _DICT_VIEWS and isinstance(func.value, cst.Name):
                if func.value.value != name.value:
                    return None
                continue  # filtered from itself
            model = self._parameters_of(source, through_dict=False)
            if model is None:
                return None
            models.append(model)
        return models[0] if len(models) == 1 else None


def _binds(target: cst.BaseExpression, name: str) -> bool:
    """`for p in ...` or `for n, p in ...` binds `name` to the parameter."""
    if isinstance(target, cst.Name):
        return target.value == name
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        last = target.elements[1].value
        return isinstance(last, cst.Name) and last.value == name
    return False
