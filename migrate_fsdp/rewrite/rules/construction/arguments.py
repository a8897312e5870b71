"""What an `FSDP(...)` call is given, by FSDP1 parameter name, however it is spelt.

Real code passes FSDP1's arguments positionally in its signature order, by
keyword, through `module=`, and through `**kwargs` built as a dict literal or
`dict(...)` in the same scope; values are often names assigned once nearby
(`policy = ModuleWrapPolicy({Block})`). This module binds a call and follows
such names to the expression that gives the value, so that the keyword rules
see the same thing whatever the spelling.
"""

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import Assignment

# FullyShardedDataParallel.__init__'s parameters, in order (torch 2.x).
FSDP1_SIGNATURE = (
    "module",
    "process_group",
    "sharding_strategy",
    "cpu_offload",
    "auto_wrap_policy",
    "backward_prefetch",
    "mixed_precision",
    "ignored_modules",
    "param_init_fn",
    "device_id",
    "sync_module_states",
    "forward_prefetch",
    "limit_all_gathers",
    "use_orig_params",
    "ignored_states",
    "device_mesh",
)


@dataclass(frozen=True, eq=False)
class Definition:
    """`name = value`: the only assignment of `name` that a use can see."""

    target: cst.Name
    value: cst.BaseExpression
    statement: cst.SimpleStatementLine
    assignment: Assignment

    @property
    def loads(self) -> list[cst.CSTNode]:
        return [access.node for access in self.assignment.references]


@dataclass(frozen=True, eq=False)
class Argument:
    name: str  # FSDP1 parameter name
    value: cst.BaseExpression  # the expression that gives it (in the call, or in a `**kwargs` dict)
    arg: cst.Arg  # the call's argument it arrives through: where diagnostics point
    kwargs: Definition | None = None  # the `**kwargs` dict it came from


class Unbindable(Exception):
    """The call's arguments cannot be known statically; `node` is where to say so."""

    def __init__(self, node: cst.CSTNode, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.message = message


class Definitions:
    """Single assignments `name = value` of the file, fed from the read-only pass."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._by_target: dict[int, tuple[cst.Assign, cst.SimpleStatementLine]] = {}

    def note(self, assign: cst.Assign) -> None:
        statement = self.ctx.statement()
        if (
            len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
        ):
            self._by_target[id(assign.targets[0].target)] = (assign, statement)

    def of(self, name: cst.CSTNode) -> Definition | None:
        """The definition a use of `name` reads, when there is exactly one."""
        if not isinstance(name, cst.Name):
            return None
        scope = self.ctx.scope(name)
        if scope is None:
            return None
        assignments = scope[name.value]
        if len(assignments) != 1:
            return None
        (assignment,) = assignments
        if not isinstance(assignment, Assignment):
            return None
        found = self._by_target.get(id(assignment.node))
        if found is None:
            return None
        assign, statement = found
        return Definition(assignment.node, assign.value, statement, assignment)

    def all_of(self, name: cst.CSTNode) -> list[Definition] | None:
        """Every assignment a use of `name` may read (`x = A` / `if c: x = B`), when each is a plain `name = value`."""
        if not isinstance(name, cst.Name):
            return None
        scope = self.ctx.scope(name)
        if scope is None:
            return None
        found = []
        for assignment in scope[name.value]:
            known = self._by_target.get(id(assignment.node)) if isinstance(assignment, Assignment) else None
            if known is None:
                return None
            found.append(Definition(assignment.node, known[0].value, known[1], assignment))
        return found or None

    def follow(self, node: cst.BaseExpression, use_site: cst.CSTNode) -> tuple[cst.BaseExpression, Definition | None]:
        """The value a name stands for, when it can be moved to `use_site` unchanged.

        Returns (node, None) when `node` is not such a name.
        """
        definition = self.of(node)
        if definition is None or not self.same_meaning(definition.value, use_site):
            return node, None
        return definition.value, definition

    def same_meaning(self, expression: cst.BaseExpression, use_site: cst.CSTNode) -> bool:
        """Every free name in `expression` refers to the same thing at `use_site`."""
        use_scope = self.ctx.scope(use_site)
        here = self.ctx.scope(expression)
        if use_scope is None or here is None:
            return False
        for name in _free_names(expression):
            if self.ctx.scope(name) is here and here[name.value] != use_scope[name.value]:
                return False
        return True


def _free_names(expression) -> list[cst.Name]:
    found = []

    class _Collect(cst.CSTVisitor):
        def visit_Attribute(self, node) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node) -> None:
            found.append(node)

    expression.visit(_Collect())
    return found


def bind(call: cst.Call, definitions: Definitions, is_kwargs_use, skip: int = 0) -> dict[str, Argument]:
    """FSDP1 arguments of `call` by parameter name; `skip` leading args are not FSDP1's (partial's `FSDP`).

    `is_kwargs_use(name)` says whether a load of a name is a `**name` of an
    FSDP1 call (the only uses a kwargs dict may have, so that its contents are
    known).
    """
    bound: dict[str, Argument] = {}

    def add(name: str, value, arg, kwargs=None) -> None:
        if name not in FSDP1_SIGNATURE:
            raise Unbindable(arg, f"`{name}` is not an FSDP1 argument")
        if name in bound:
            raise Unbindable(arg, f"`{name}` is given twice")
        bound[name] = Argument(name, value, arg, kwargs)

    for index, arg in enumerate(call.args[skip:]):
        if arg.star == "*":
            raise Unbindable(arg, "arguments passed with `*` cannot be known before run time")
        if arg.star == "**":
            definition = _kwargs_definition(arg, call, definitions, is_kwargs_use)
            for key, value in _dict_items(definitions.ctx, definition.value):
                add(key, value, arg, definition)
        elif arg.keyword is None:
            if index >= len(FSDP1_SIGNATURE):
                raise Unbindable(arg, "too many positional arguments for FSDP1")
            add(FSDP1_SIGNATURE[index], arg.value, arg)
        else:
            add(arg.keyword.value, arg.value, arg)
    return bound


def _kwargs_definition(arg: cst.Arg, call, definitions: Definitions, is_kwargs_use) -> Definition:
    definition = definitions.of(arg.value)
    reason = None
    if definition is None:
        reason = "is not a dict assigned once in this scope"
    elif definitions.ctx.scope(definition.target) is not definitions.ctx.scope(call):
        reason = "is assigned in another scope"
    elif _dict_items(definitions.ctx, definition.value) is None:
        reason = "is not a dict literal or dict(...) with literal keys"
    elif not all(is_kwargs_use(load) for load in definition.loads):
        reason = "is also used or changed elsewhere, so its contents at the call are unknown"
    if reason:
        raise Unbindable(arg, f"`**{definitions.ctx.code(arg.value)}` {reason}")
    return definition


def _dict_items(ctx, value: cst.BaseExpression) -> list | None:
    """(key, value) pairs of a dict literal with string keys or of `dict(k=v, ...)`; None otherwise."""
    items = []
    if isinstance(value, cst.Dict):
        for element in value.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return None
            items.append((element.key.evaluated_value, element.value))
    elif isinstance(value, cst.Call) and ctx.matches(value.func, "builtins.dict"):
        for arg in value.args:
            if arg.keyword is None or arg.star:
                return None
            items.append((arg.keyword.value, arg.value))
    else:
        return None
    return items
