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
from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS, method_owner
from migrate_fsdp.rewrite.analysis.parameter_loops import (
    handed_in,
    model_iterated,
    model_named,
)
from migrate_fsdp.rewrite.rules.training.base import (
    FSDP2_TOKENS,
    TrainingRule,
    literal_bool,
)
from migrate_fsdp.rewrite.syntax import walk

_SHAPE_ATTRIBUTES = ("ndim", "shape")
_SHAPE_METHODS = ("dim", "size")
_NAME_TESTS = ("endswith", "startswith")


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
        (b"named_parameters(", b"weight_decay"),
    )

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._wraps: dict[tuple, list] = {}  # (id(function), model's code) -> the FSDP(model, ...) calls there

    def leave_Attribute(self, original: cst.Attribute, updated):
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        method = isinstance(parent, cst.Call) and parent.func is original and original.attr.value in _SHAPE_METHODS
        if original.attr.value in _SHAPE_ATTRIBUTES or method:
            self._check(original, self.ctx.code(original) + ("()" if method else ""))
        return updated

    def leave_Comparison(self, original: cst.Comparison, updated):
        """`"bias" in n`, `n in no_decay` of a parameter name `n`: with use_orig_params=False FSDP1 named its flat
        parameters (`..._flat_param`), FSDP2 names each parameter, so groups picked by name change."""
        if len(original.comparisons) == 1 and isinstance(original.comparisons[0].operator, (cst.In, cst.NotIn)):
            comparator = original.comparisons[0].comparator
            if isinstance(comparator, cst.Call) and isinstance(comparator.func, cst.Attribute) and comparator.func.attr.value == "split":
                comparator = comparator.func.value  # `"norm" in n.split(".")`: a part of the name too
            if isinstance(comparator, cst.Name):  # `"bias" in n`: a part of the name
                self._check_name(comparator, original)
            if isinstance(original.left, cst.Name):  # `n in names`: the whole name
                self._check_name(original.left, original, whole=True)
        return updated

    def leave_Call(self, original: cst.Call, updated):
        func = original.func
        if isinstance(func, cst.Attribute) and func.attr.value in _NAME_TESTS and isinstance(func.value, cst.Name):
            self._check_name(func.value, original)
        return updated

    def _check_name(self, name: cst.Name, read, whole: bool = False) -> None:
        """`whole`: the name is looked up as it is, so only a model known to be FSDP1's is reported: a helper's
        lookup (`n in model_parallel_dims`) is of keys taken from the same model, most often."""
        if in_summon(self.ctx, self.ctx.stack):  # FSDP1 named each parameter there
            return
        model = model_named(self.ctx, name.value)
        if model is None or self._read_before_wrapping(model, read):
            return
        prefixed = whole and self.models.is_fsdp_model(model) and self._original_names(model)
        if not prefixed and not self._answers_otherwise(model, read, not whole and not self._wrapped_here(model), named=True):
            return
        if prefixed and self.ctx.program.use(model, self.code, tuple(self.ctx.stack)) is not None:
            return  # it stays FSDP1
        why = (
            "FSDP1 (use_orig_params=True) named each parameter behind `_fsdp_wrapped_module.` prefixes, FSDP2 without "
            "them, so a whole name looked up here (taken before wrapping, say) now matches"
            if prefixed
            else "FSDP1 with use_orig_params=False named its flat parameters (`..._flat_param`), FSDP2 names each "
            "parameter, so what this picks changes (no-decay groups now get the biases and norms)"
        )
        self.ctx.report(read, self.code, f"`{self.ctx.code(read)}` tests a parameter name of `{self.ctx.code(model)}`: {why}")

    def _answers_otherwise(self, model, read, handed: bool, named: bool = False, own_method=None) -> bool:
        """Whether `read` of `model`'s parameters answers otherwise once the model converts: an FSDP1 model that
        converts (and, for a name, was not built with use_orig_params=True); else a module handed to this code where
        `handed` holds, in a file an FSDP1 model that converts may reach, or in a module's own method (`own_method`),
        which FSDP1 forwarded to from the wrapper (`model.configure_optimizers()`) wherever the class is defined."""
        if self.models.is_fsdp_model(model):
            if named and self._original_names(model):
                return False  # FSDP1 named each parameter
            return self.ctx.program.use(model, self.code, tuple(self.ctx.stack)) is None  # else it stays FSDP1
        if not (handed and handed_in(self.ctx, model) and self.ctx.program.may_build_fsdp1()):
            return False
        # both questions asked each time: the program answers each on a rewrite of its own
        reached = (own_method is not None and own_method(model)) or self.ctx.program.dispatch(read)
        flat = not named or self.ctx.program.flat_names()  # else every model that converts named each parameter
        return reached and flat

    def _read_before_wrapping(self, model, read) -> bool:
        """The function around wraps `model` itself (`FSDP(net, ...)`) only after `read`: the plain module's."""
        at = self.ctx.position(read)
        wraps = self._wrappings(model)
        return bool(wraps) and all(self.ctx.position(node) > at for node in wraps)

    def _wrapped_here(self, model) -> bool:
        """The function around wraps `model` itself (`FSDP(net, ...)`): what it reads of `net` is the plain module's."""
        return bool(self._wrappings(model))

    def _wrappings(self, model) -> list:
        """The `FSDP(model, ...)` calls of the function around, found once a function and model."""
        function = next((n for n in reversed(self.ctx.stack) if isinstance(n, cst.FunctionDef)), None)
        if function is None:
            return []
        code = self.ctx.code(model)
        key = (id(function), code)
        if key not in self._wraps:
            self._wraps[key] = [
                node
                for node, _ in walk(function.body)
                if isinstance(node, cst.Call) and node.args and self.ctx.matches(node.func, FSDP_CLASS) and self.ctx.code(node.args[0].value) == code
            ]
        return self._wraps[key]

    def _original_names(self, model) -> bool:
        """Every FSDP(...) of this file reaching `model` passes use_orig_params=True: FSDP1 named each parameter."""
        origins = self.models.origins(model, self.ctx.stack)
        if origins is None or origins.untied or not origins.constructors:
            return False
        return all(
            any(a.keyword is not None and a.keyword.value == "use_orig_params" and literal_bool(a.value) for a in c.args)
            for c in origins.constructors
        )

    def _check(self, read: cst.Attribute, shown: str) -> None:
        if not isinstance(read.value, cst.Name) or in_summon(self.ctx, self.ctx.stack):  # full parameters there
            return
        model = model_iterated(self.ctx, read.value.value)
        if model is None or self._read_before_wrapping(model, read):
            return
        if not self._answers_otherwise(model, read, self._collects(), own_method=self._own_method):
            return
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
