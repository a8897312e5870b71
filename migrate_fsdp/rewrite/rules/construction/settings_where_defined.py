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
- `functools.partial(size_based_auto_wrap_policy, ...)` -> the same partial of
  a local copy of that policy.
"""

import libcst as cst

from migrate_fsdp.rewrite.rule import Rule
from migrate_fsdp.rewrite.rules.construction.auto_wrap_policy import CLASS_POLICIES, PARTIAL, SIZE_HELPER, WRAP
from migrate_fsdp.rewrite.rules.construction.codegen import call
from migrate_fsdp.rewrite.rules.construction.mixed_precision import MIXED_PRECISION

HELPER = "fsdp2_mixed_precision"


class SettingsWhereDefined(Rule):
    code = "MF112"
    name = "settings-where-defined"
    summary = "MixedPrecision / wrap policies defined apart, read only by converted constructors -> FSDP2 forms"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._converted: dict[int, cst.BaseExpression] = {}

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.is_covered([id(n) for n in ctx.stack]) or not self._convertible(node):
            return
        if ctx.program.setting(node):
            self._converted[id(node)] = self._form(node)
            ctx.mark_handled(node)

    def leave_Call(self, original: cst.Call, updated):
        return self._converted.pop(id(original), updated)

    def _convertible(self, node: cst.Call) -> bool:
        ctx = self.ctx
        if ctx.matches(node.func, MIXED_PRECISION):
            return not any(arg.star for arg in node.args)
        return self._classes(node) is not None or self._size_based(node) is not None

    def _form(self, node: cst.Call) -> cst.BaseExpression:
        if self.ctx.matches(node.func, MIXED_PRECISION):
            return node.with_changes(func=cst.Name(self.ctx.add_helper(HELPER)))
        classes = self._classes(node)
        if classes is None:
            return call(node.func, cst.Name(self.ctx.add_helper(SIZE_HELPER)), **self._size_based(node))
        if isinstance(classes, (cst.Set, cst.List, cst.Tuple)):
            return cst.Tuple([cst.Element(element.value) for element in classes.elements])
        return call("tuple", classes)

    def _classes(self, node: cst.Call) -> cst.BaseExpression | None:
        """The classes of `ModuleWrapPolicy(X)` or `partial(transformer_auto_wrap_policy, transformer_layer_cls=X)`."""
        ctx = self.ctx
        if ctx.matches(node.func, f"{WRAP}.ModuleWrapPolicy"):
            arguments = _keywords(node.args, positional=("module_classes",))
            classes = arguments.get("module_classes") if arguments is not None and len(arguments) == 1 else None
        elif ctx.matches(node.func, PARTIAL) and node.args and not node.args[0].keyword and not node.args[0].star:
            arguments = _keywords(node.args[1:])
            keyword = next((k for q, k in CLASS_POLICIES.items() if ctx.matches(node.args[0].value, q)), None)
            classes = arguments.get(keyword) if keyword is not None and arguments is not None and set(arguments) == {keyword} else None
        else:
            return None
        if isinstance(classes, (cst.Set, cst.List, cst.Tuple)) and not classes.elements:
            return None
        if isinstance(classes, (cst.Set, cst.List, cst.Tuple)) and any(isinstance(e, cst.StarredElement) for e in classes.elements):
            return None
        return classes

    def _size_based(self, node: cst.Call) -> dict | None:
        """The options of `partial(size_based_auto_wrap_policy, ...)`."""
        ctx = self.ctx
        if not (ctx.matches(node.func, PARTIAL) and node.args and not node.args[0].keyword and not node.args[0].star):
            return None
        if not ctx.matches(node.args[0].value, f"{WRAP}.size_based_auto_wrap_policy"):
            return None
        return _keywords(node.args[1:])


def _keywords(args, positional: tuple = ()) -> dict | None:
    """The arguments by name (`positional` names the leading positional ones); None with `*`/`**`."""
    found = {}
    for index, arg in enumerate(args):
        if arg.star:
            return None
        if arg.keyword is not None:
            found[arg.keyword.value] = arg.value
        elif index < len(positional):
            found[positional[index]] = arg.value
        else:
            return None
    return found
