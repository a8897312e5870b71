"""MF102: `auto_wrap_policy` -> `fully_shard` on the same submodules, children before parents, root last.

FSDP2 has no auto-wrapping: "implement your policy directly (apply
fully_shard to the desired sublayers)" (migration guide, seeds/002). FSDP1
wraps, bottom-up and never the root itself (`_wrap_utils._auto_wrap`):

- for a `_Policy` (ModuleWrapPolicy, CustomPolicy), every module of
  `root.modules()` that is not ignored and that the policy picks;
- for a callable `fn(module, recurse, nonwrapped_numel)` (transformer,
  lambda, size-based, `_or_policy`, a user's function), what
  `wrap._recursive_wrap` decides: recurse while `fn(recurse=True)`, then wrap
  a module when `fn(recurse=False)` holds for the parameters its wrapped
  children left over.

Class and predicate policies written in the file become a plain loop over
`reversed(list(model.modules()))` (every descendant comes before its
ancestor). A size-based policy, or any policy known only at run time, goes
through a small helper added to the file that replays FSDP1's traversal
without importing FSDP1.
"""

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import assign, call, expression, grouped, is_reevaluable, statements
from migrate_fsdp.rewrite.rules.construction.plan import Initialiser, KeywordRule, Unconvertible

WRAP = "torch.distributed.fsdp.wrap"
PARTIAL = "functools.partial"
CLASS_POLICIES = {f"{WRAP}.transformer_auto_wrap_policy": "transformer_layer_cls", f"{WRAP}._module_wrap_policy": "module_classes"}

_ADVICE = "call fully_shard on each submodule FSDP1 wrapped, children before parents, then on the root"

TARGETS_HELPER = "_fsdp1_wrap_targets"

SIZE_HELPER = "_size_based_auto_wrap_policy"


OR_HELPER = "_fsdp1_or_policy"
ORDER_HELPER = "_fsdp1_wrap_order"  # units in FSDP1's wrapping order, where an initialising param_init_fn runs on each


@dataclass
class Policy:
    """Which submodules FSDP1 wrapped: a predicate on the loop variable, or a runtime policy for the helper."""

    condition: Callable[[cst.Name], cst.BaseExpression] | None = None
    runtime: cst.BaseExpression | None = None
    var_hint: str = "module"
    name: str = "auto_wrap_policy"
    when: cst.BaseExpression | None = None  # the children are sharded only where this holds (`policy if cond else None`)


class AutoWrapPolicyRule(KeywordRule):
    code = "MF102"
    name = "auto-wrap-policy"
    summary = "auto_wrap_policy -> fully_shard on the same submodules, bottom-up"
    keywords = ("auto_wrap_policy",)
    leftovers = {
        f"{WRAP}.{name}": f"{name} is FSDP1's auto-wrapping, which FSDP2 does not have: {_ADVICE}"
        for name in (
            "ModuleWrapPolicy",
            "CustomPolicy",
            "transformer_auto_wrap_policy",
            "size_based_auto_wrap_policy",
            "lambda_auto_wrap_policy",
            "always_wrap_policy",
            "_or_policy",
            "_module_wrap_policy",
            "_wrap_module_cls_individually",
            "_Policy",
        )
    }

    def apply(self, argument, plan) -> None:
        definitions = self.analysis.assigned_on_branches(argument.value, plan)
        if definitions is not None:
            self._assigned(argument, definitions, plan)
            return
        value, definition = self.analysis.follow(argument.value, plan)
        if isinstance(value, cst.IfExp) and (self.analysis.is_none(value.body) or self.analysis.is_none(value.orelse)):
            # `policy if cond else None`: FSDP1 wrapped the children only where cond held, and so does the loop.
            wraps = self.analysis.is_none(value.orelse)
            when = value.test if wraps else expression("not TEST", TEST=value.test)
            chosen = value.body if wraps else value.orelse
            self.apply(argument.__class__(argument.name, chosen, argument.arg, argument.kwargs), plan)
            if plan.policy is not None:
                plan.policy.when = when
            return
        if self.analysis.is_none(value):
            return
        policy = self._static(value)
        if policy is None:
            replayed = self._replayable(value)
            if replayed is None and definition is not None:
                self.analysis.unfollow(definition, plan)
                value = argument.value
            if replayed is None and self.analysis.fsdp1_references(value):
                raise Unconvertible(f"auto_wrap_policy={self.ctx.code(argument.value)} is not a policy the rewrite can read; {_ADVICE}")
            policy = Policy(runtime=replayed or value)
            if replayed is not None and definition is not None:
                policy.name = definition.target.value  # the user's name for it, free again once the definition goes
        plan.policy = policy

    def _assigned(self, argument, definitions, plan) -> None:
        """`policy = None` / `if cfg.wrap: policy = ModuleWrapPolicy(...)`: each assignment becomes a torch-only
        policy function where it stands, and the helper replays it where the variable is not None."""
        maybe_none = False
        for definition in definitions:
            if self.analysis.is_none(definition.value):
                maybe_none = True
                continue
            replayed = self._replayable(definition.value)
            if replayed is not None:
                plan.redefined[definition] = replayed
            elif self.analysis.fsdp1_references(definition.value):
                raise Unconvertible(
                    f"{argument.value.value} = {self.ctx.code(definition.value)} is not a policy the rewrite can read; {_ADVICE}",
                    definition.value,
                )
        if maybe_none and len(definitions) == sum(self.analysis.is_none(d.value) for d in definitions):
            return
        when = expression("NAME is not None", NAME=argument.value) if maybe_none else None
        plan.policy = Policy(runtime=argument.value, name=argument.value.value, when=when)

    # ----- reading policies ------------------------------------------------------------------

    def _static(self, node) -> Policy | None:
        """A policy whose choice is a predicate on each module, written in the file."""
        ctx = self.ctx
        if ctx.matches(node, f"{WRAP}.always_wrap_policy"):
            return Policy(lambda var: cst.Name("True"))
        if isinstance(node, cst.Call) and ctx.matches(node.func, f"{WRAP}.ModuleWrapPolicy"):
            classes = only_argument(node, "module_classes")
            return None if classes is None else Policy(self._isinstance(classes))
        if isinstance(node, cst.Call) and ctx.matches(node.func, f"{WRAP}.CustomPolicy"):
            function = only_argument(node, "lambda_fn")
            if function is not None and self._may_return_kwargs(function):
                raise Unconvertible(
                    f"CustomPolicy({ctx.code(function)}) can return FSDP1 arguments for some modules, which have no "
                    f"FSDP2 policy form; {_ADVICE}, giving those modules their own fully_shard arguments"
                )
            return None if function is None else self._predicate(function)
        if not (isinstance(node, cst.Call) and ctx.matches(node.func, PARTIAL) and node.args):
            return None
        func, options = node.args[0].value, keywords(node.args[1:])
        if options is None:
            return None
        for qualified, keyword in CLASS_POLICIES.items():
            if ctx.matches(func, qualified) and set(options) == {keyword}:
                return Policy(self._isinstance(options[keyword]))
        if ctx.matches(func, f"{WRAP}.lambda_auto_wrap_policy") and set(options) == {"lambda_fn"}:
            return self._predicate(options["lambda_fn"])
        if ctx.matches(func, f"{WRAP}._or_policy") and set(options) == {"policies"}:
            return self._any_of(options["policies"])
        return None

    def _any_of(self, policies) -> Policy | None:
        if not isinstance(policies, (cst.List, cst.Tuple)):
            return None
        parts = []
        for element in policies.elements:
            value, _ = self.analysis.definitions.follow(element.value, element.value)
            part = self._static(value)
            if part is None:
                return None
            parts.append(part.condition)

        def condition(var):
            return _either([part(var) for part in parts])

        return Policy(condition)

    def _isinstance(self, classes) -> Callable:
        if isinstance(classes, (cst.Set, cst.List, cst.Tuple)) and classes.elements:
            items = [element.value for element in classes.elements]
            spelled = items[0] if len(items) == 1 else cst.Tuple([cst.Element(item) for item in items])
        else:
            spelled = call("tuple", classes)
        return lambda var: expression("isinstance(V, CLASSES)", V=var, CLASSES=spelled)

    def _predicate(self, function) -> Policy:
        """`function(module)` as a condition; a one-parameter lambda's body is used directly."""
        params = function.params.params if isinstance(function, cst.Lambda) else ()
        if len(params) == 1 and not params[0].default and not function.params.kwonly_params and not _has_scopes(function.body):
            param = params[0].name.value
            return Policy(lambda var: _renamed(function.body, param, var), var_hint=param)
        return Policy(lambda var: expression("F(V)", F=function, V=var))

    def _may_return_kwargs(self, function) -> bool:
        """Whether a CustomPolicy function may return an FSDP1 kwargs dict (not converted)."""
        return may_return_kwargs(function, self.analysis.function(function))

    def _replayable(self, node) -> cst.BaseExpression | None:
        """A torch-only callable policy(module, recurse, nonwrapped_numel) doing what `node` did; None if unknown.

        For policies that need FSDP1's traversal (size-based, or-combinations
        that include one): FSDP1's policy functions are replaced by local copies.
        """
        ctx = self.ctx
        static = self._static(node)
        if static is not None:
            condition = static.condition(cst.Name("module"))
            return expression("lambda module, recurse, nonwrapped_numel: recurse or COND", COND=condition)
        size_based = f"{WRAP}.size_based_auto_wrap_policy"
        if ctx.matches(node, size_based):
            return cst.Name(ctx.add_helper(SIZE_HELPER))
        if not (isinstance(node, cst.Call) and ctx.matches(node.func, PARTIAL) and node.args):
            return None
        options = keywords(node.args[1:])
        if options is None:
            return None
        func = node.args[0].value
        if ctx.matches(func, size_based):
            return call(node.func, cst.Name(ctx.add_helper(SIZE_HELPER)), **options)
        if ctx.matches(func, f"{WRAP}._or_policy") and set(options) == {"policies"}:
            policies = options["policies"]
            if not isinstance(policies, (cst.List, cst.Tuple)):
                return None
            parts = [self._replayable(self.analysis.definitions.follow(e.value, e.value)[0]) for e in policies.elements]
            if None in parts:
                return None
            local = ctx.add_helper(OR_HELPER)
            return call(node.func, cst.Name(local), policies=cst.List([cst.Element(part) for part in parts]))
        return None

    # ----- writing the loop ------------------------------------------------------------------

    def loop(self, plan, module, var: cst.Name, child: cst.Call, full_precision: tuple | None, skip) -> list[cst.BaseStatement]:
        """The statements that shard the submodules FSDP1 wrapped, children first (see _loop), where the policy applies."""
        loop = self._loop(plan, module, var, child, full_precision, skip)
        if plan.policy.when is None:
            return loop
        return [cst.If(test=plan.policy.when, body=cst.IndentedBlock(loop))]

    def _loop(self, plan, module, var: cst.Name, child: cst.Call, full_precision: tuple | None, skip) -> list[cst.BaseStatement]:
        """The statements that shard the submodules FSDP1 wrapped, children first.

        `full_precision` is (classes, call) for the modules FSDP1 wrapped in full
        precision, `skip` the set of ignored modules (or None).
        """
        policy = plan.policy
        values = {"M": module, "V": var, "CHILD": child}
        if policy.runtime is not None:
            helper = self.ctx.add_helper(TARGETS_HELPER)
            prefix = []
            runtime = policy.runtime
            if not is_reevaluable(runtime):
                name = self.analysis.names.fresh(plan.site.node, policy.name, "auto_wrap_policy", "fsdp1_auto_wrap_policy")
                prefix = [assign(name, runtime)]
                runtime = cst.Name(name)
            kwargs = {}
            if skip is not None:
                kwargs.update(ignored_modules=skip[0], ignored_params=skip[1])
            if full_precision is not None:
                kwargs["full_precision"] = full_precision[0]
            values["TARGETS"] = call(helper, module, runtime, **kwargs)
            if full_precision is None:
                return prefix + statements("for V in TARGETS:\n    CHILD", **values)
            return prefix + statements(
                """
                for V in TARGETS:
                    # FSDP1 kept these in full precision under MixedPrecision
                    if isinstance(V, FP):
                        FP_CHILD
                    else:
                        CHILD
                """,
                FP=full_precision[0],
                FP_CHILD=full_precision[1],
                **values,
            )
        condition = policy.condition(var)
        values["COND"] = condition
        loop_head = "for V in reversed(list(M.modules())):"
        if isinstance(plan.param_init, Initialiser):  # it runs on each unit before sharding: FSDP1's order
            loop_head = f"for V in {self.ctx.add_helper(ORDER_HELPER)}(M):"
        if full_precision is None:
            skipped = "V is not M" + (" and V not in SKIP" if skip is not None else "")
            test = skipped if _is_true(condition) else f"{skipped} and COND"
            return statements(f"{loop_head}\n    if {test}:\n        CHILD", SKIP=skip[0] if skip else None, **values)
        skipped = "V is M" + (" or V in SKIP" if skip is not None else "")
        chosen = "else:" if _is_true(condition) else "elif COND:"
        return statements(
            f"""
            {loop_head}
                if {skipped}:
                    continue
                # FSDP1 kept these in full precision under MixedPrecision
                if isinstance(V, FP):
                    FP_CHILD
                {chosen}
                    CHILD
            """,
            SKIP=skip[0] if skip else None,
            FP=full_precision[0],
            FP_CHILD=full_precision[1],
            **values,
        )


def _either(conditions: list) -> cst.BaseExpression:
    result = grouped(conditions[0])
    for condition in conditions[1:]:
        result = cst.BooleanOperation(left=result, operator=cst.Or(), right=grouped(condition))
    return result


def _has_scopes(node) -> bool:
    """Whether `node` holds a lambda or comprehension (which could rebind a name)."""
    found = []

    class _Find(cst.CSTVisitor):
        def on_visit(self, child) -> bool:
            if isinstance(child, (cst.Lambda, cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)):
                found.append(child)
            return not found

    node.visit(_Find())
    return bool(found)


def _renamed(body, param: str, var: cst.Name):
    """A lambda's body with its parameter renamed to the loop variable."""
    if var.value == param:
        return body

    class _Rename(cst.CSTTransformer):
        def leave_Name(self, original, updated):
            return var if updated.value == param else updated

        def leave_Attribute(self, original, updated):
            return updated.with_changes(attr=original.attr)  # `m.weight`: only `m` is the parameter

        def leave_Arg(self, original, updated):
            return updated.with_changes(keyword=original.keyword)

    return body.visit(_Rename())


def _is_true(node) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def only_argument(node: cst.Call, name: str):
    """The call's single argument, positional or by `name`; None otherwise."""
    if len(node.args) != 1 or node.args[0].star:
        return None
    arg = node.args[0]
    return arg.value if arg.keyword is None or arg.keyword.value == name else None


def keywords(args) -> dict | None:
    """The arguments by keyword; None when one is positional or starred."""
    if any(arg.keyword is None or arg.star for arg in args):
        return None
    return {arg.keyword.value: arg.value for arg in args}


def may_return_kwargs(function, definition: cst.FunctionDef | None) -> bool:
    """Whether the CustomPolicy function `function` (a lambda, or a name whose `definition` is found) may return an
    FSDP1 kwargs dict for some module, which no FSDP2 form has."""
    if isinstance(function, cst.Lambda):
        return bool(_dicts_in(function.body))
    if definition is None:
        return True
    return any(_dicts_in(ret.value) for ret in _returns(definition) if ret.value is not None)


def _dicts_in(node) -> list:
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Dict(self, dict_node) -> None:
            found.append(dict_node)

        def visit_Call(self, call_node) -> None:
            if isinstance(call_node.func, cst.Name) and call_node.func.value == "dict":
                found.append(call_node)

        def visit_Lambda(self, node) -> bool:
            return False

    node.visit(_Find())
    return found


def _returns(function: cst.FunctionDef) -> list[cst.Return]:
    found = []

    class _Find(cst.CSTVisitor):
        def visit_Return(self, node) -> None:
            found.append(node)

        def visit_FunctionDef(self, node) -> bool:
            return node is function

        def visit_Lambda(self, node) -> bool:
            return False

    function.visit(_Find())
    return found
