"""MF112: an FSDP1 setting defined apart from its FSDP(...) call takes its FSDP2 form where it is defined.

Recipes keep `bf16 = MixedPrecision(...)` and `functools.partial(
transformer_auto_wrap_policy, ...)` in a policies module and hand them to
FSDP(...) through functions and run-time choices. The converted constructor
reads such a value through a helper (`_fsdp1_mixed_precision`,
`_fsdp1_wrap_targets`) that takes the FSDP1 object or its FSDP2 form; once
the program model has followed the value to every place it reaches and each
is such a constructor that converts (analysis/value_flow.py), the definition
itself becomes the FSDP2 form and no FSDP1 is left. Otherwise it stays,
with the advice of its keyword's rule.

- `MixedPrecision(...)` -> `fsdp2_mixed_precision(...)`, the same arguments:
  the FSDP2 policies for the root and auto-wrapped children, the modules
  FSDP1 kept in full precision and the buffer dtype.
- `functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=X)`
  and `ModuleWrapPolicy(X)` -> the tuple of classes whose instances get
  their own fully_shard.
- `CustomPolicy(f)`, `f` returning True/False, -> `functools.partial(
  _fsdp1_lambda_policy, lambda_fn=f)`: the modules `f` picks, as FSDP1 picked
  them. No helper reads an FSDP1 CustomPolicy, so the constructors one reaches
  convert together with it or stay together, all of them when `f` may
  return FSDP1 arguments.
- `ShardingStrategy.X` -> `"X"`, which the sharding helpers read as they read the member.
- `functools.partial(size_based_auto_wrap_policy, ...)`,
  `functools.partial(lambda_auto_wrap_policy, lambda_fn=f)` and
  `functools.partial(_or_policy, policies=[...])` -> the same partial of a
  local, torch-only copy of that policy (an `_or_policy`'s policies may be
  FSDP1's or converted ones: it converts when its own value may).
"""

from collections.abc import Callable

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS
from migrate_fsdp.rewrite.rule import Rule
from migrate_fsdp.rewrite.rules.construction.analysis import function_binding
from migrate_fsdp.rewrite.rules.construction.auto_wrap_policy import (
    CLASS_POLICIES,
    OR_HELPER,
    PARTIAL,
    SIZE_HELPER,
    WRAP,
    keywords,
    may_return_kwargs,
    only_argument,
)
from migrate_fsdp.rewrite.rules.construction.codegen import call, string
from migrate_fsdp.rewrite.rules.construction.mixed_precision import MIXED_PRECISION
from migrate_fsdp.rewrite.rules.construction.sharding_strategy import strategy_member

HELPER = "fsdp2_mixed_precision"
LAMBDA_HELPER = "_fsdp1_lambda_policy"
# FSDP1 policy functions -> (their only options, the torch-only copy a partial of them gets)
_REPLAYED = {
    f"{WRAP}.size_based_auto_wrap_policy": (None, SIZE_HELPER),
    f"{WRAP}.lambda_auto_wrap_policy": ({"lambda_fn"}, LAMBDA_HELPER),
    f"{WRAP}._or_policy": ({"policies"}, OR_HELPER),
}
_BUILDERS = ("builtins.set", "builtins.list", "builtins.tuple", "builtins.frozenset")


class SettingsWhereDefined(Rule):
    code = "MF112"
    name = "settings-where-defined"
    summary = "MixedPrecision / wrap policies defined apart, read only by converted constructors -> FSDP2 forms"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._converted: dict[int, Callable] = {}  # id(original) -> its FSDP2 form from the node as rewritten

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.is_covered([id(n) for n in ctx.stack if id(n) not in self._converted]):
            return  # (the policies inside an `_or_policy`'s copy are settings of their own)
        custom = self._custom_function(node)
        if custom is not None:
            # No helper reads an FSDP1 CustomPolicy (only FSDP1's private API does): the constructors it reaches
            # stand or fall together, and with its FSDP2 form, which one returning FSDP1 arguments lacks.
            binding = function_binding(ctx, custom)
            definition = None if binding is None else binding.node
            readable = not may_return_kwargs(custom, definition)
            if ctx.program.setting(node, custom_policy=True, readable=readable) and readable:
                converted = call(
                    cst.Name(ctx.require_import("functools", "partial")), cst.Name(ctx.add_helper(LAMBDA_HELPER)), lambda_fn=custom
                )
                self._converted[id(node)] = lambda updated: converted
                ctx.mark_handled(node)
            return
        if not self._convertible(node):
            return
        replayed = self._replayed(node)
        reads = frozenset({"policies"}) if replayed is not None and replayed[0] == OR_HELPER else frozenset()  # in either form
        if ctx.program.setting(node, reads):
            self._converted[id(node)] = self._form(node)
            ctx.mark_handled(node)
        elif ctx.program.only_checkpointing(node):
            # torchtune's `apply_activation_checkpointing(auto_wrap_policy=ModuleWrapPolicy(...))`: a function policy
            # of its own, which picks the same modules with no FSDP1 module
            self._converted[id(node)] = self._checkpointing_form(node)
            ctx.mark_handled(node)

    def leave_Call(self, original: cst.Call, updated):
        form = self._converted.pop(id(original), None)
        return updated if form is None else form(updated)

    def collect_Attribute(self, node: cst.Attribute) -> None:
        """`ShardingStrategy.X` apart from a constructor becomes `"X"`, which the sharding helpers read too. Judged in
        the read-only walk, before a member left over is reported in the rewriting one."""
        ctx = self.ctx
        member = strategy_member(ctx, node)
        if member is None:
            return
        parent = ctx.stack[-2] if len(ctx.stack) >= 2 else None
        read = isinstance(parent, cst.Attribute) and parent.value is node or isinstance(parent, cst.Call) and parent.func is node
        if read or any(isinstance(n, cst.Call) and ctx.matches(n.func, FSDP_CLASS) for n in ctx.stack):
            return  # `ShardingStrategy.X.name` reads the member itself; a constructor's own argument is its rule's
        if ctx.program.setting(node):
            self._converted[id(node)] = lambda updated: string(member)
            ctx.mark_handled(node)

    def leave_Attribute(self, original: cst.Attribute, updated):
        form = self._converted.pop(id(original), None)
        return updated if form is None else form(updated)

    def _convertible(self, node: cst.Call) -> bool:
        ctx = self.ctx
        if ctx.matches(node.func, MIXED_PRECISION):
            return not any(arg.star for arg in node.args)
        return self._classes(node) is not None or self._replayed(node) is not None

    def _form(self, node: cst.Call):
        """The FSDP2 form of the definition, from the call as rewritten (policies inside an `_or_policy`'s list
        converted too); a function or a copy takes the arguments as written, their layout and comments kept."""
        if self.ctx.matches(node.func, MIXED_PRECISION):
            helper = cst.Name(self.ctx.add_helper(HELPER))
            return lambda updated: updated.with_changes(func=helper)
        classes = self._classes(node)
        if classes is None:
            copy = cst.Name(self.ctx.add_helper(self._replayed(node)[0]))
            return lambda updated: updated.with_changes(args=[updated.args[0].with_changes(value=copy), *updated.args[1:]])
        classes = _class_tuple(classes)
        return lambda updated: classes

    def _checkpointing_form(self, node: cst.Call):
        """The form apply_activation_checkpointing takes: a function policy, as FSDP1's wrap module's were (a tuple
        of classes it does not take: `partial(_fsdp1_lambda_policy, lambda_fn=lambda module: isinstance(...))`)."""
        classes = self._classes(node)
        if classes is None:
            return self._form(node)
        classes = _class_tuple(classes)
        # the classes taken now, as FSDP1's policy took them (the name holding them may be rebound to the policy)
        picks = cst.parse_expression("lambda module, classes=CLASSES: isinstance(module, classes)")
        default = picks.params.params[1]
        picks = picks.with_changes(
            params=picks.params.with_changes(params=[picks.params.params[0], default.with_changes(default=classes)])
        )
        partial = cst.Name(self.ctx.require_import("functools", "partial"))
        converted = call(partial, cst.Name(self.ctx.add_helper(LAMBDA_HELPER)), lambda_fn=picks)
        return lambda updated: converted

    def _custom_function(self, node: cst.Call) -> cst.BaseExpression | None:
        """The function of `CustomPolicy(f)`."""
        return only_argument(node, "lambda_fn") if self.ctx.matches(node.func, f"{WRAP}.CustomPolicy") else None

    def _classes(self, node: cst.Call) -> cst.BaseExpression | None:
        """The classes of `ModuleWrapPolicy(X)` or `partial(transformer_auto_wrap_policy, transformer_layer_cls=X)`."""
        ctx = self.ctx
        if ctx.matches(node.func, f"{WRAP}.ModuleWrapPolicy"):
            classes = only_argument(node, "module_classes")
        elif ctx.matches(node.func, PARTIAL) and node.args and not node.args[0].keyword and not node.args[0].star:
            arguments = keywords(node.args[1:])
            keyword = next((k for q, k in CLASS_POLICIES.items() if ctx.matches(node.args[0].value, q)), None)
            classes = arguments.get(keyword) if keyword is not None and arguments is not None and set(arguments) == {keyword} else None
        else:
            return None
        if isinstance(classes, cst.Call) and ctx.matches(classes.func, *_BUILDERS) and len(classes.args) == 1:
            arg = classes.args[0]  # `set([A, B])`, `set(names)`: the classes inside
            classes = None if arg.keyword or arg.star else arg.value
        if isinstance(classes, (cst.Set, cst.List, cst.Tuple)):
            if not classes.elements or any(isinstance(e, cst.StarredElement) for e in classes.elements):
                return None
        return classes

    def _replayed(self, node: cst.Call) -> tuple[str, dict] | None:
        """(the torch-only copy, the options) of `partial(<an FSDP1 policy function>, ...)`."""
        ctx = self.ctx
        if not (ctx.matches(node.func, PARTIAL) and node.args and not node.args[0].keyword and not node.args[0].star):
            return None
        for qualified, (allowed, helper) in _REPLAYED.items():
            if ctx.matches(node.args[0].value, qualified):
                options = keywords(node.args[1:])
                if options is None or allowed is not None and set(options) != allowed:
                    return None
                return helper, options
        return None


def _class_tuple(classes: cst.BaseExpression) -> cst.BaseExpression:
    """The classes of a policy as the tuple isinstance takes: `{A, B}` -> `(A, B)`, anything else -> `tuple(...)`."""
    if isinstance(classes, (cst.Set, cst.List, cst.Tuple)):
        return cst.Tuple([cst.Element(element.value) for element in classes.elements])
    return call("tuple", classes)
