"""MF107: `ignored_modules` / `ignored_states` -> fully_shard's `ignored_params`.

FSDP1 ignores the parameters of the given modules' whole subtrees
(`_get_ignored_modules`, `_get_ignored_params`), or the given parameters
(ignored_states), in the root and in every auto-wrapped child; auto-wrapping
also skips the ignored modules. FSDP2 takes the parameters: the rewrite
passes the same set to every fully_shard call and skips the same modules.
"""

from dataclasses import dataclass

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import expression, is_reevaluable
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible


@dataclass
class Ignored:
    roots: cst.BaseExpression  # what the user passed
    states: bool  # ignored_states (parameters or modules), not ignored_modules
    parameters: bool = False  # torch 2.0's ignored_parameters: parameters only


class IgnoredModulesRule(KeywordRule):
    code = "MF107"
    name = "ignored-modules"
    summary = "ignored_modules / ignored_states -> ignored_params"
    keywords = ("ignored_modules", "ignored_states")

    def apply(self, argument, plan) -> None:
        if self.analysis.is_none(argument.value):
            return
        if plan.ignored is not None:
            raise Unconvertible("FSDP1 rejects ignored_modules together with ignored_states; keep one")
        keyword = argument.arg.keyword
        parameters = keyword is not None and keyword.value == "ignored_parameters"
        plan.ignored = Ignored(self._none_as_empty(argument.value), argument.name == "ignored_states", parameters)

    def _none_as_empty(self, value: cst.BaseExpression) -> cst.BaseExpression:
        """`value` with each None it may be (`[m.embed] if freeze else None`, a kwargs item set under an `if`) as
        `()`: FSDP1 took None for nothing ignored, the converted code iterates it."""
        if isinstance(value, cst.IfExp):
            return value.with_changes(body=self._none_as_empty(value.body), orelse=self._none_as_empty(value.orelse))
        if self.analysis.is_none(value):
            return cst.Tuple([])
        if self._may_be_none(value):  # `cfg.ignored_modules`, a plugin's setting whose default is None
            return cst.BooleanOperation(
                left=value, operator=cst.Or(), right=cst.Tuple([]), lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
            )
        return value

    def _may_be_none(self, value, follow: bool = True) -> bool:
        if isinstance(value, (cst.List, cst.Tuple, cst.Set, cst.ListComp, cst.SetComp, cst.GeneratorExp)):
            return False
        if self._parameters(value) or isinstance(value, cst.Call) and self.ctx.matches(value.func, *_COLLECTIONS):
            return False
        if isinstance(value, cst.Name) and follow:
            definitions = self.analysis.definitions.all_of(value)
            return not definitions or any(self._may_be_none(d.value, follow=False) for d in definitions)
        return True

    def finish(self, plan) -> None:
        ignored = plan.ignored
        if ignored is not None and ignored.states and plan.has_children and not _displays_or_names(ignored.roots):
            raise Unconvertible(
                "ignored_states is read twice by the converted code (its parameters, and its modules to skip when "
                "auto-wrapping): assign it to a variable first",
                plan.arguments["ignored_states"].arg,
            )

    def modules(self, ignored: Ignored, anchor) -> cst.BaseExpression:
        """Every module FSDP1 ignored: the given modules and everything under them."""
        if ignored.states:
            module = self.analysis.names.ref(anchor, "torch.nn.Module")
            return expression(f"{{sub for s in ROOTS if isinstance(s, {module}) for sub in s.modules()}}", ROOTS=ignored.roots)
        return expression("{sub for m in ROOTS for sub in m.modules()}", ROOTS=ignored.roots)

    def params(self, ignored: Ignored, anchor, modules: cst.BaseExpression | None = None) -> cst.BaseExpression:
        """The parameters FSDP1 ignored; from `modules` (the expanded set) when it is at hand."""
        if modules is not None and not ignored.states:
            return expression("{p for m in MODULES for p in m.parameters(recurse=False)}", MODULES=modules)
        if ignored.parameters or (ignored.states and self._parameters(ignored.roots)):
            return expression("set(ROOTS)", ROOTS=ignored.roots)
        if ignored.states:
            module = self.analysis.names.ref(anchor, "torch.nn.Module")
            return expression(
                f"{{p for s in ROOTS for p in (s.parameters() if isinstance(s, {module}) else [s])}}", ROOTS=ignored.roots
            )
        return expression("{p for m in ROOTS for p in m.parameters()}", ROOTS=ignored.roots)

    def _parameters(self, node) -> bool:
        """`node` visibly holds parameters: `x.parameters()`, or list/tuple/set of it."""
        if isinstance(node, cst.Call) and self.ctx.matches(node.func, "builtins.list", "builtins.tuple", "builtins.set"):
            node = node.args[0].value if len(node.args) == 1 else None
        return (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "parameters"
            and not node.args
        )


_COLLECTIONS = ("builtins.list", "builtins.tuple", "builtins.set")


def _displays_or_names(node) -> bool:
    if isinstance(node, cst.BooleanOperation) and isinstance(node.right, cst.Tuple) and not node.right.elements:
        node = node.left  # `(x or ())`
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return all(is_reevaluable(element.value) for element in node.elements)
    return is_reevaluable(node)
