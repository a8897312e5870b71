"""What an `FSDP(...)` call is given, by FSDP1 parameter name, however it is spelt.

Real code passes FSDP1's arguments positionally in its signature order, by
keyword, through `module=`, and through `**kwargs` built as a dict literal or
`dict(...)` in the same scope, possibly filled item by item after
(`kw["mixed_precision"] = mp`, `kw.update(mixed_precision=mp)`, also under an `if`, or an `if` nested in one); values are
often names assigned once nearby
(`policy = ModuleWrapPolicy({Block})`). This module binds a call and follows
such names to the expression that gives the value, so that the keyword rules
see the same thing whatever the spelling.
"""

from dataclasses import dataclass, replace

import libcst as cst
from libcst.metadata import Assignment

from migrate_fsdp.rewrite.rules.construction import choice
from migrate_fsdp.rewrite.syntax import dotted, walk

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

    @property
    def statements(self) -> tuple[cst.BaseStatement, ...]:
        """The statements that go when the definition does."""
        return (self.statement,)


@dataclass(frozen=True, eq=False)
class Fill:
    """`name["key"] = value` or one item of `name.update(key=value, ...)`, on a line of its own, in the dict's block or in
    a branch of an `if` / `elif` / `else` chain there (or on the line of an `if` without else)."""

    key: str
    value: cst.BaseExpression
    target: cst.Name  # the load of the dict's name
    statement: cst.SimpleStatementLine | cst.If  # the `if` itself for `if cond: name["key"] = value`
    block: cst.CSTNode  # the block holding the statement
    chain: cst.If | None  # the `if` statement in the dict's block whose branch holds it
    path: tuple[tuple[cst.If, bool], ...] = ()  # the chain's `if`s down to that branch, and whether each test holds
    own_block: cst.CSTNode | None = None  # the block the statement itself sits in
    # (block, chain, path) for each block around the statement that a dict there sees it fill in, innermost first:
    # an `if` nested in a branch of another fills that one's block through both chains
    levels: tuple = ()


@dataclass(frozen=True, eq=False)
class FilledDict(Definition):
    """A kwargs dict filled item by item after its definition (`kw = {}; kw["mixed_precision"] = mp`)."""

    fills: tuple[Fill, ...] = ()
    emptied: tuple[cst.CSTNode, ...] = ()  # the `if`s (or their body or `else:`) that only fill the dict: they go with it

    @property
    def loads(self) -> list[cst.CSTNode]:
        filling = {id(fill.target) for fill in self.fills}
        return [load for load in super().loads if id(load) not in filling]

    @property
    def statements(self) -> tuple[cst.BaseStatement, ...]:
        going = {id(node): node for node in (self.statement, *(fill.statement for fill in self.fills), *self.emptied)}
        return tuple(going.values())


# Spellings of older torch releases: 2.0 took the parameters to ignore as `ignored_parameters`, renamed in 2.1.
_RENAMED = {"ignored_parameters": "ignored_states"}

_BACKWARD_PRE = "torch.distributed.fsdp.BackwardPrefetch.BACKWARD_PRE"

# FSDP1's defaults for what an `if` may or may not put in a kwargs dict (backward_prefetch's is not a literal).
_DEFAULTS = {
    **{name: "None" for name in FSDP1_SIGNATURE if name not in ("module", "backward_prefetch")},
    "sync_module_states": "False",
    "forward_prefetch": "False",
    "use_orig_params": "False",
    "limit_all_gathers": "True",
}


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
    """Assignments `name = value` and `name["key"] = value` of the file, fed from the read-only pass."""

    def __init__(self, ctx, order: dict[int, int]) -> None:
        self.ctx = ctx
        self.order = order  # statement id -> position in the file
        self._by_target: dict[int, tuple[cst.Assign | cst.AnnAssign, cst.SimpleStatementLine]] = {}
        self._blocks: dict[int, cst.CSTNode] = {}  # definition statement id -> its block
        self._fills: dict[int, tuple[Fill, ...]] = {}  # id(load of the dict's name) -> what its statement fills
        self.calls: dict[int, int] = {}  # id(call) -> position of its statement
        self.logged: set[int] = set()  # ids of names passed as such to print(...) or a logger's method

    def note(self, assign: cst.Assign | cst.AnnAssign) -> None:
        placed = self._placement()
        target = _single_target(assign)
        if placed is None or target is None:
            return
        statement, own_block, levels = placed
        if isinstance(target, cst.Name) and isinstance(statement, cst.SimpleStatementLine):
            self._by_target[id(target)] = (assign, statement)
            self._blocks[id(statement)] = own_block
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name) and len(target.slice) == 1:
            key = target.slice[0].slice
            if isinstance(key, cst.Index) and isinstance(key.value, cst.SimpleString):
                fill = Fill(key.value.evaluated_value, assign.value, target.value, statement, *levels[0], own_block, levels)
                self._fills[id(target.value)] = (fill,)

    def note_update(self, call: cst.Call) -> None:
        """`name.update(key=value, ...)` as a statement of its own: a fill for each keyword."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.attr.value == "update"):
            return
        if not call.args or any(arg.keyword is None or arg.star for arg in call.args):
            return
        placed = self._placement()
        expression = self.ctx.stack[-2] if len(self.ctx.stack) > 1 else None
        if placed is None or not (isinstance(expression, cst.Expr) and expression.value is call):
            return
        statement, own_block, levels = placed
        self._fills[id(func.value)] = tuple(
            Fill(arg.keyword.value, arg.value, func.value, statement, *levels[0], own_block, levels) for arg in call.args
        )

    def _placement(self) -> tuple[cst.CSTNode, cst.CSTNode, tuple] | None:
        """(statement, its block, levels) for the small statement being visited, when it is alone on its line: `x = v`,
        or `if cond: x = v` on one line without else (then the statement and the first chain are that `if`). Each
        level is (a block around the statement, the `if` chain in that block it is under, the path down that chain),
        innermost first: the statement's own block with no chain, then one level for each `if` / `elif` / `else`
        branch the chain sits in alone or beside other statements."""
        statement = self.ctx.statement()
        if isinstance(statement, cst.If):
            alone = isinstance(statement.body, cst.SimpleStatementSuite) and len(statement.body.body) == 1
            if not alone or statement.orelse is not None:
                return None
        elif not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        stack = self.ctx.stack
        at = next(i for i in range(len(stack) - 1, -1, -1) if stack[i] is statement)
        own_block = stack[at - 1]
        if isinstance(statement, cst.If):
            path = ((statement, True),)
            levels = [(own_block, statement, path)]
        else:
            path = ()
            levels = [(own_block, None, path)]
        while True:
            outer = _branch_around(stack, at)
            if outer is None:
                break
            at, steps = outer
            path = (*steps, *path)
            levels.append((stack[at - 1], stack[at], path))
        return statement, own_block, tuple(levels)

    def singles(self) -> list[Definition]:
        """Every `name = value` that is the only assignment of its name in its scope."""
        found = []
        for assign, _ in self._by_target.values():
            definition = self.of(_single_target(assign))
            if definition is not None:
                found.append(definition)
        return found

    def fill_values(self, definition: Definition) -> list[cst.BaseExpression]:
        """What `name["key"] = value` statements put in the dict `definition` makes."""
        return [fill.value for load in definition.loads for fill in self._fills.get(id(load), ())]

    def note_logged(self, call: cst.Call) -> None:
        """Names `call` only shows (`print("kwargs:", kw)`, `log.info("%s", kw)`): reading cannot change them."""
        func = call.func
        if isinstance(func, cst.Name):
            shows = func.value == "print"
        else:
            shows = (
                isinstance(func, cst.Attribute)
                and func.attr.value in _LOG_METHODS
                and "log" in dotted(func.value).lower()
            )
        if shows:
            self.logged.update(id(name) for arg in call.args if not arg.star for name in _shown_names(arg.value))

    def shown(self, definition: Definition) -> bool:
        """The dict is also printed or logged: it stays, as the program shows it (its items are read again at the call)."""
        return any(id(load) in self.logged for load in definition.loads)

    def filled(self, definition: Definition, call: cst.Call, is_kwargs_use) -> FilledDict | None:
        """`definition` with the fills of its dict before `call`, when every other load is a `**` of an FSDP1 call,
        or a print or log of the dict whose items can be read twice."""
        fills = []
        for load in definition.loads:
            if is_kwargs_use(load):
                continue
            if id(load) in self.logged:
                continue
            filling = self._fills.get(id(load), ())
            block = self._blocks.get(id(definition.statement))
            level = next((level for level in filling[0].levels if level[0] is block), None) if filling else None
            if level is not None:
                # as the dict's block sees it: on a line of its own (whenever the dict is made), or in a branch of
                # a chain there, maybe through the branches of chains inside that one
                filling = tuple(replace(fill, block=block, chain=level[1], path=level[2]) for fill in filling)
            if filling and filling[0].block is not block and self._within(filling[0].statement, block):
                raise _NotFilled(
                    f"is filled in a nested block (`{_line(self.ctx, filling[0].statement)}`); fill it in the dict's "
                    "block or in one if/elif/else chain there"
                )
            if not filling or (
                filling[0].block is not block
                or not self.order[id(definition.statement)] < self.order[id(filling[0].statement)] < self.calls.get(id(call), -1)
            ):
                return None
            fills += filling
        fills.sort(key=lambda fill: self.order[id(fill.statement)])  # a later item overrides an earlier one
        if self.shown(definition) and not all(
            _evaluable_twice(self.ctx, value) for value in [definition.value, *(fill.value for fill in fills)]
        ):
            return None
        emptied = []
        for chain in {id(fill.chain): fill.chain for fill in fills if fill.chain is not None}.values():
            ours = [fill for fill in fills if fill.chain is chain]
            inside = {id(fill.statement) for fill in ours}
            if id(chain) in inside:  # `if test: kw["key"] = value` on one line
                emptied.append(chain)
                continue
            # the chains nested in its branches that lead to fills: a step into an `if` that is no `elif` of the last
            chains = {
                id(step[0]): step[0]
                for fill in ours
                for step, before in zip(fill.path[1:], fill.path)
                if before[0].orelse is not step[0]
            }
            inside |= set(chains)
            links = [link for top in (chain, *chains.values()) for link in _links(top)]
            bodies = [link.body.body for link in links if isinstance(link.body, cst.IndentedBlock)]
            bodies += [link.orelse.body.body for link in links if isinstance(link.orelse, cst.Else)]
            others = [[statement for statement in body if id(statement) not in inside] for body in bodies]
            tests = [link.test for link in links]
            changing = next(
                ((statement, test) for body in others for statement in body for test in tests if not _keeps_test(statement, test)),
                None,
            )
            if changing is not None:
                raise _NotFilled(
                    f"is filled beside `{_line(self.ctx, changing[0])}`, which may change what `if "
                    f"{self.ctx.code(changing[1])}` reads, or leave the block"
                )
            if not any(others):
                emptied.append(chain)
            # Emptied branches of a chain with statements left go as dead blocks (imports.finish_module).
        return FilledDict(
            definition.target, definition.value, definition.statement, definition.assignment, tuple(fills), tuple(emptied)
        )

    def _within(self, statement, block) -> bool:
        """`statement` is somewhere inside `block`."""
        return block is not None and any(node is statement for node, _ in walk(block))

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


_LOG_METHODS = frozenset(("debug", "info", "warning", "warn", "error", "critical", "exception", "log"))

# Calls that build a value and do nothing else: evaluating one twice (in a dict the program keeps and at the call) is harmless.
_BUILDERS = (
    "torch.distributed.fsdp.",
    "functools.partial",
    "builtins.set",
    "builtins.frozenset",
    "builtins.dict",
    "builtins.tuple",
    # the device a value names, read again: the same while the script does not change the current device between
    "torch.device",
    "torch.cuda.current_device",
    "torch.accelerator.current_device_index",
)


def _evaluable_twice(ctx, expression) -> bool:
    """Evaluating `expression` a second time gives the same value and does nothing else."""
    for node, _ in walk(expression):
        if isinstance(node, (cst.Await, cst.Yield, cst.NamedExpr)):
            return False
        if isinstance(node, cst.Call) and not any(q.startswith(_BUILDERS) for q in ctx.qualified_names(node.func)):
            return False
    return True


def _keeps_test(statement, test: cst.BaseExpression) -> bool:
    """`statement`, beside fills in an `if test:`, leaves `test` as it was, so the call may read `test` again to know
    whether the fills happened. It may also leave the path to the call (return, raise: a raise only where no `try` of
    the statement can catch it), as a check of the settings does."""
    read = {
        dotted(node)
        for node, parents in walk(test)
        if isinstance(node, (cst.Name, cst.Attribute)) and not (parents and getattr(parents[-1], "attr", None) is node)
    } - {""}
    catches = any(isinstance(node, cst.Try) for node, _ in walk(statement))
    for node, _ in walk(statement):
        if isinstance(node, (cst.Global, cst.Nonlocal, cst.Del)) or isinstance(node, cst.Raise) and catches:
            return False
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            targets = [node.name]
        elif isinstance(node, (cst.For, cst.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, cst.Assign):
            targets = [target.target for target in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (cst.Import, cst.ImportFrom)) and not isinstance(node.names, cst.ImportStar):
            targets = [alias.asname.name if alias.asname else alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            while isinstance(target, cst.Subscript):
                target = target.value
            changed = dotted(target)
            if not changed or any(name == changed or name.startswith(changed + ".") or changed.startswith(name + ".") for name in read):
                return False
    return True


def _single_target(assign: cst.Assign | cst.AnnAssign) -> cst.BaseAssignTargetExpression | None:
    """What `x = value` or `x: T = value` binds, when it binds one thing."""
    if isinstance(assign, cst.AnnAssign):
        return assign.target if assign.value is not None else None
    return assign.targets[0].target if len(assign.targets) == 1 else None


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


def bind(call: cst.Call, definitions: Definitions, is_kwargs_use, skip: int = 0, dicts: list | None = None) -> dict[str, Argument]:
    """FSDP1 arguments of `call` by parameter name; `skip` leading args are not FSDP1's (partial's `FSDP`).

    `is_kwargs_use(name)` says whether a load of a name is a `**name` of an
    FSDP1 call (the only uses a kwargs dict may have, so that its contents are
    known). The kwargs dicts read go to `dicts`, empty ones included.
    """
    bound: dict[str, Argument] = {}

    def add(name: str, value, arg, kwargs=None) -> None:
        name = _RENAMED.get(name, name)
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
            if dicts is not None:
                dicts.append(definition)
            for key, value in _filled_items(definitions.ctx, definition, arg):
                add(key, value, arg, definition)
        elif arg.keyword is None:
            if index >= len(FSDP1_SIGNATURE):
                raise Unbindable(arg, "too many positional arguments for FSDP1")
            add(FSDP1_SIGNATURE[index], arg.value, arg)
        else:
            add(arg.keyword.value, arg.value, arg)
    return bound


_SHOWING_BUILTINS = ("sorted", "list", "tuple", "set", "len", "str", "repr")
_VIEWS = ("keys", "values", "items")


def _shown_names(value: cst.BaseExpression) -> list[cst.Name]:
    """The names an argument of a print or log call only reads: `kw`, `sorted(kw)`, `len(kw)`, `kw.items()`,
    `f"{kw}"`."""
    if isinstance(value, cst.Name):
        return [value]
    if isinstance(value, cst.Call) and len(value.args) == 1 and not value.args[0].star and not value.args[0].keyword:
        if isinstance(value.func, cst.Name) and value.func.value in _SHOWING_BUILTINS:
            return _shown_names(value.args[0].value)
    if isinstance(value, cst.Call) and not value.args and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in _VIEWS and isinstance(value.func.value, cst.Name):
            return [value.func.value]
    if isinstance(value, cst.FormattedString):
        parts = [part.expression for part in value.parts if isinstance(part, cst.FormattedStringExpression)]
        return [name for part in parts for name in _shown_names(part)]
    return []


class _NotFilled(Exception):
    """Why the fills of a kwargs dict cannot be read as the call sees them (a message after the dict's name)."""


def _line(ctx, statement) -> str:
    """The first line of `statement`, shortened, for a message."""
    if hasattr(statement, "leading_lines"):
        statement = statement.with_changes(leading_lines=())  # not the comments above it (a TODO of an earlier run)
    text = ctx.code(statement).strip().splitlines()[0]
    return text if len(text) <= 50 else text[:47] + "..."


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
        try:
            definition = definitions.filled(definition, call, is_kwargs_use)
        except _NotFilled as refused:
            definition, reason = None, str(refused)
        if definition is None and reason is None:
            reason = "is also used or changed elsewhere, so its contents at the call are unknown"
    if reason:
        raise Unbindable(arg, f"`**{definitions.ctx.code(arg.value)}` {reason}")
    return definition


def _filled_items(ctx, definition: Definition, arg: cst.Arg) -> list:
    """The dict's (key, value) pairs at the call: its literal, then each fill in order.

    Fills in the branches of an `if` / `elif` / `else` chain give `value if test else ...` down the chain, each branch
    that does not fill the key keeping what it held before (or FSDP1's default).
    """
    items = dict(_dict_items(ctx, definition.value))
    fills = list(getattr(definition, "fills", ()))
    while fills:
        fill = fills.pop(0)
        if fill.chain is None:
            items[fill.key] = fill.value
            continue
        group = [fill]
        while fills and fills[0].chain is fill.chain:
            group.append(fills.pop(0))
        for key in dict.fromkeys(item.key for item in group):
            items[key] = _chain_value(ctx, arg, fill.chain, [item for item in group if item.key == key], items.get(key))
    return list(items.items())


def _chain_value(ctx, arg: cst.Arg, chain: cst.If, fills: list[Fill], before):
    """What one key holds after an `if` chain whose branches `fills` fill (in order: the last in a branch wins), maybe
    through chains nested in those branches."""
    key = fills[0].key
    if before is None and key == "backward_prefetch" and all(ctx.matches(fill.value, _BACKWARD_PRE) for fill in fills):
        return fills[-1].value  # FSDP1's default: the item holds BACKWARD_PRE either way
    everywhere = _everywhere(chain, [(fill, 0) for fill in fills])
    if before is None and not everywhere and key == "backward_prefetch":
        # FSDP1's default, spelled only for the choice: MF108 drops a backward_prefetch chosen at run time
        before = cst.parse_expression("BackwardPrefetch.BACKWARD_PRE")
    elif before is None and not everywhere:
        if key not in _DEFAULTS:
            test = ctx.code(fills[0].path[-1][0].test)
            raise Unbindable(
                arg,
                f"`{key}` is set only under `if {test}:`; write both cases in one item "
                f"(`{key}=... if {test} else BackwardPrefetch.BACKWARD_PRE`)",
            )
        before = cst.Name(_DEFAULTS[key])
    tree = _tree(chain, [(fill, 0) for fill in fills], before)
    return choice.join(tree, lambda value: value)  # neighbouring branches giving the same value ask once


def _branches(chain: cst.If, placed: list) -> dict:
    """`placed` ((fill, where its path enters `chain`)) by the branch of `chain` each is in: (id(link), holds) ->
    [(fill, where its path goes on into a chain nested there, or its length)]."""
    links = {id(link) for link in _links(chain)}
    branches: dict = {}
    for fill, start in placed:
        end = start
        while end + 1 < len(fill.path) and id(fill.path[end + 1][0]) in links:
            end += 1
        link, holds = fill.path[end]
        branches.setdefault((id(link), holds), []).append((fill, end + 1))
    return branches


def _keys(chain: cst.If) -> list:
    """The branches of `chain`: each link's body, then the `else` (keyed on the last link, not holding)."""
    links = _links(chain)
    return [(id(link), True) for link in links] + [(id(links[-1]), False)]


def _runs(group: list) -> list:
    """A branch's fills in order, those nested in one chain taken together: [(fill or None, chain or None, group)]."""
    runs = []
    for fill, start in group:
        if start == len(fill.path):
            runs.append((fill, None, None))
        elif runs and runs[-1][1] is fill.path[start][0]:
            runs[-1][2].append((fill, start))
        else:
            runs.append((None, fill.path[start][0], [(fill, start)]))
    return runs


def _everywhere(chain: cst.If, placed: list) -> bool:
    """Every way through `chain` (and the chains nested in it) fills the key."""
    if _links(chain)[-1].orelse is None:
        return False
    branches = _branches(chain, placed)
    for key in _keys(chain):
        runs = _runs(branches.get(key, []))
        if not any(fill is not None or _everywhere(inner, group) for fill, inner, group in runs):
            return False
    return True


def _tree(chain: cst.If, placed: list, before):
    """The choice `chain` makes for the key: each branch's last fill, or what a chain nested there makes of what
    the key held before it."""
    branches = _branches(chain, placed)

    def held(key):
        value = before
        for fill, inner, group in _runs(branches.get(key, [])):
            value = fill.value if fill is not None else _tree(inner, group, value)
        return value

    links = _links(chain)
    tree = held((id(links[-1]), False))
    for link in reversed(links):
        tree = choice.Choice(link.test, held((id(link), True)), tree)
    return tree


def _links(chain: cst.If) -> list[cst.If]:
    """The `if` and its `elif`s."""
    links = [chain]
    while isinstance(links[-1].orelse, cst.If):
        links.append(links[-1].orelse)
    return links


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


def _branch_around(stack, at: int):
    """(stack index of the chain holding, in one of its branches, the block around `stack[at]`; the steps down that
    chain), or None where that block is no `if` / `elif` / `else` body."""
    if at < 3:
        return None
    block, owner = stack[at - 1], stack[at - 2]
    if isinstance(owner, cst.If) and owner.body is block:
        index, steps = at - 2, [(owner, True)]
    elif isinstance(owner, cst.Else) and isinstance(stack[at - 3], cst.If) and stack[at - 3].orelse is owner:
        index, steps = at - 3, [(stack[at - 3], False)]
    else:
        return None
    while index >= 1 and isinstance(stack[index - 1], cst.If) and stack[index - 1].orelse is stack[index]:  # an `elif`
        index -= 1
        steps.insert(0, (stack[index], False))
    return index, tuple(steps)
