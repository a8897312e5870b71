"""Which expressions hold FSDP1 models: the analysis the training-loop rules share.

`model.no_sync()` is FSDP1's only when `model` is an FSDP1 model: DDP has a
`no_sync` and a `module` too, and a user's class may have a `clip_grad_norm_`.
So before touching a method call, a rule asks what its receiver holds. Within
one file that is often knowable, and this module works it out from the
original tree (the rules feed it from their `collect_*` hooks):

- a name or attribute chain assigned from `FSDP(...)`, from a
  `functools.partial(FSDP, ...)` result, from a local function that returns
  one, or from another FSDP1 model (`m = model`, `model.to(device)`);
- narrowed by `if isinstance(x, FSDP):`, `assert isinstance(x, FSDP)` and what follows
  `if not isinstance(x, DDP): return`, or in the else of `if not isinstance(x, DDP):`;
- a parameter annotated with the FSDP class, or (in a script, or for a private
  or nested function) one that every call in the file passes an FSDP1 model;
- the loop variable of `for m in FSDP.fsdp_modules(...)`.

Flow is followed the simple way: the last unconditional assignment before a
use wins, assignments in branches after it may also reach it. A use that
DDP, or something we cannot see, may also reach is UNKNOWN: the rules then
report instead of guessing.
"""

from dataclasses import dataclass, field
from enum import Enum

import libcst as cst
from libcst.metadata import Assignment, ComprehensionScope

from migrate_fsdp.rewrite.forward_refs import resolve_spelled
from migrate_fsdp.rewrite.syntax import chain_root, children, dotted, walk

FSDP_CLASS = "torch.distributed.fsdp.FullyShardedDataParallel"
# What a rewrite turns FSDP1 models into: judged the same, so a second run reports what the first did.
FSDP2_CLASSES = ("torch.distributed.fsdp.FSDPModule", "torch.distributed._composable.fsdp.FSDPModule")
FULLY_SHARD = ("torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard")
FSDP_MODULES = FSDP_CLASS + ".fsdp_modules"
ROOT_MODULES_HELPER = "fsdp2_root_modules"  # MF207's helper for `fsdp_modules(root_only=True)`
DDP_CLASSES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
_PARTIAL = ("functools.partial",)
MANUAL_WRAP = "torch.distributed.fsdp.wrap.wrap"  # an FSDP1 constructor under an enable_wrap(wrapper_cls=FSDP) context
SUMMON_FULL_PARAMS = f"{FSDP_CLASS}.summon_full_params"
PARAMETER_READS = ("parameters", "named_parameters")  # nn.Module methods handing out its parameters
# nn.Module methods that return the module itself.
_RETURNS_SELF = frozenset(
    {"to", "cuda", "cpu", "float", "half", "bfloat16", "double", "train", "eval", "requires_grad_", "to_empty"}
)
# Methods that put their last argument into a module container: `blocks.append(FSDP(b))`.
_STORING = frozenset({"append", "insert", "add_module", "register_module"})
_CONTAINERS = ("torch.nn.ModuleDict", "torch.nn.ModuleList", "torch.nn.Sequential")
# Statements whose bodies may not run (or run instead of another branch).
# Where a model known to be sharded comes from, when not from a constructor in this file.
FSDP2 = "an FSDP2 module"
UNTIED = "an FSDP1 model from out of sight (a parameter's annotation, an isinstance test)"
_CONDITIONAL = (cst.If, cst.Else, cst.For, cst.While, cst.ExceptHandler, cst.ExceptStarHandler, cst.Match)
_MAX_DEPTH = 8


def _innermost_scope(path):
    return next((n for n in reversed(path) if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef))), None)


def assignments_of(scope, name: str) -> list:
    """The assignments of `name` visible in `scope` that have a node in this file (builtins have none)."""
    if scope is None or name not in scope:
        return []
    return [a for a in scope[name] if isinstance(a, Assignment)]


def is_main_guard(node) -> bool:
    """`if __name__ == "__main__":`"""
    test = node.test if isinstance(node, cst.If) else None
    return (
        isinstance(test, cst.Comparison)
        and dotted(test.left) == "__name__"
        and any(isinstance(c.comparator, cst.SimpleString) and c.comparator.evaluated_value == "__main__" for c in test.comparisons)
    )


@dataclass(frozen=True)
class Origins:
    """Where a sharded model used somewhere may come from."""

    constructors: frozenset  # FSDP1 constructor calls of this file whose result reaches the use
    fsdp2: bool  # an FSDP2 module (fully_shard, FSDPModule) may reach it
    untied: bool  # an FSDP1 model this file does not build may reach it


class Kind(Enum):
    FSDP = "a sharded model: an FSDP1 wrapper, or an FSDP2 module (what a rewrite made of one)"
    DDP = "a DDP model"
    PLAIN = "not a wrapped model"
    UNKNOWN = "unknown"


def method_owner(node: cst.FunctionDef, path) -> cst.ClassDef | None:
    """The class `node` is an instance method of (not a static or class method), if any; `path`: the nodes from the
    module down to `node`."""
    if len(path) < 3 or not isinstance(path[-3], cst.ClassDef):
        return None
    if any(dotted(d.decorator) in ("staticmethod", "classmethod") for d in node.decorators):
        return None
    return path[-3]


def combine(kinds) -> Kind:
    """What a use holds when any of `kinds` may reach it."""
    kinds = set(kinds)
    if not kinds:
        return Kind.UNKNOWN
    if Kind.FSDP in kinds and kinds <= {Kind.FSDP, Kind.PLAIN}:
        return Kind.FSDP
    if kinds <= {Kind.PLAIN}:
        return Kind.PLAIN
    if kinds <= {Kind.DDP, Kind.PLAIN}:
        return Kind.DDP
    return Kind.UNKNOWN


@dataclass
class _Definition:
    seq: int  # source order
    path: tuple  # original nodes from the module down to the defining statement
    value: cst.BaseExpression | None = None  # evaluated lazily
    kind: Kind | None = None  # known without evaluation (annotation, isinstance, loop over fsdp_modules)
    narrowing: bool = False  # holds for the whole block at the end of `path`
    after_exit: bool = False  # holds after the `if` ending `path`, whose body leaves the block
    wraps_itself: bool = False  # `self.m = FSDP(self.m)`: earlier values were the unwrapped module
    element: int | None = None  # `a, b = value`: which element of `value` this target gets
    source: str | None = None  # for a fixed FSDP kind: FSDP2 or UNTIED (an FSDP1 model from out of sight)

    @property
    def function(self):
        return next((n for n in reversed(self.path) if isinstance(n, (cst.FunctionDef, cst.Lambda))), None)


@dataclass
class _Function:
    node: cst.FunctionDef
    path: tuple
    returns: list = field(default_factory=list)  # (value, path)
    callable_from_elsewhere: bool = True


class FsdpModels:
    """The shared analysis; one per file, in `ctx.facts[FACTS_KEY]`."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._seen: set[int] = set()
        self._seq = 0
        self._names: dict[int, _Definition] = {}  # id(target Name or Param) -> definition
        self._chains: dict[tuple, list[_Definition]] = {}  # (owner id, chain) -> definitions
        self._narrowings: dict[str, list[_Definition]] = {}  # chain -> isinstance narrowings
        # (owner id, chain) -> values put into the container the chain names: `d[k] = v`, `d.append(v)`
        self._stores: dict[tuple, list[_Definition]] = {}
        self._functions: dict[int, _Function] = {}  # id(FunctionDef) -> info
        self._calls: list[tuple[cst.Call, tuple]] = []  # calls of plain names, for parameter inference
        self._call_funcs: set[int] = set()
        self._memo: dict = {}
        self.constructors: list[cst.Call] = []  # FSDP(...) calls and functools.partial(FSDP, ...) factories
        # While tracing where a model comes from: what a constructor (by id) or a kind of source
        # (FSDP2, UNTIED) is taken to give instead of Kind.FSDP.
        self._assume: dict = {}
        self.has_main_guard = False
        self.imports_fsdp = False  # any name of torch.distributed.fsdp, FSDP1 or FSDP2
        self.imports_ddp = False

    # ----- collecting (original tree, read-only pass) --------------------------------------

    def note(self, node: cst.CSTNode) -> None:
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        handler = getattr(self, f"_note_{type(node).__name__}", None)
        if handler is not None:
            handler(node)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _statement_path(self) -> tuple:
        stack = self.ctx.stack
        for index in range(len(stack) - 1, -1, -1):
            if isinstance(stack[index], (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return tuple(stack[: index + 1])
        return tuple(stack)

    def _add_target(self, target, definition: _Definition) -> None:
        if isinstance(target, cst.Name):
            self._names[id(target)] = definition
        elif isinstance(target, cst.Attribute) and dotted(target):
            owner = self._chain_owner(target, definition.path)
            if owner is not None:
                self._chains.setdefault((owner, dotted(target)), []).append(definition)
        elif isinstance(target, cst.Subscript) and dotted(target.value):
            self._store(target.value, definition)
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = definition.value.elements if isinstance(definition.value, (cst.Tuple, cst.List)) else None
            elements = target.elements
            same_shape = values is not None and len(values) == len(elements) and not any(
                isinstance(e, cst.StarredElement) for e in [*elements, *values]
            )
            for index, element in enumerate(elements):
                if same_shape:
                    part = _Definition(definition.seq, definition.path, values[index].value)
                else:
                    part = _Definition(definition.seq, definition.path, definition.value, definition.kind, element=index)
                self._add_target(element.value, part)

    def _store(self, container, definition: _Definition) -> None:
        owner = self._chain_owner(container, definition.path)
        if owner is not None:
            self._stores.setdefault((owner, dotted(container)), []).append(definition)

    def _chain_owner(self, node, path) -> int | None:
        """What an attribute chain is keyed by: the class for `self.x`, else the scope of its root name."""
        root = chain_root(node)
        function = next((n for n in reversed(path) if isinstance(n, cst.FunctionDef)), None)
        if function is not None and function.params.params and function.params.params[0].name.value == root:
            owner = next(
                (n for n in reversed(path[: path.index(function)]) if isinstance(n, (cst.ClassDef, cst.FunctionDef))),
                None,
            )
            if isinstance(owner, cst.ClassDef):
                return id(owner)
        base = node
        while isinstance(base, cst.Attribute):
            base = base.value
        scope = self.ctx.scope(base)
        if scope is None:
            return None
        scopes = {a.scope for a in assignments_of(scope, root)}
        return id(scopes.pop()) if len(scopes) == 1 else id(scope)

    def _note_Assign(self, node: cst.Assign) -> None:
        path = self._statement_path()
        seq = self._next_seq()
        for target in node.targets:
            wraps = self._wraps_itself(target.target, node.value)
            self._add_target(target.target, _Definition(seq, path, node.value, wraps_itself=wraps))

    def _note_AnnAssign(self, node: cst.AnnAssign) -> None:
        path = self._statement_path()
        annotation = node.annotation.annotation
        kind = self.annotation_kind(annotation)
        if node.value is None and kind is None:
            return
        definition = _Definition(self._next_seq(), path, node.value, kind, source=self._class_source(annotation))
        self._add_target(node.target, definition)

    def _note_AugAssign(self, node: cst.AugAssign) -> None:
        self._add_target(node.target, _Definition(self._next_seq(), self._statement_path(), kind=Kind.UNKNOWN))

    def _note_For(self, node: cst.For) -> None:
        seq, path = self._next_seq(), (*self.ctx.stack, node.body)
        for target, iterable in self._loop_pairs(node):
            source = self._lists_fsdp_modules(iterable) if iterable is not None else None
            kind = Kind.FSDP if source else Kind.UNKNOWN
            self._add_target(target, _Definition(seq, path, kind=kind, source=source or None))

    def _loop_pairs(self, node: cst.For) -> list:
        """(target, what it iterates over) for the loop's targets: each of `zip(a, b)`'s and `enumerate(a)`'s
        targets apart (None: a count), else the whole target over the whole iterable."""
        target, iterable = node.target, node.iter
        if isinstance(iterable, cst.Call) and isinstance(target, (cst.Tuple, cst.List)):
            args = iterable.args
            plain = all(arg.keyword is None and not arg.star for arg in args)
            targets = [element.value for element in target.elements if not isinstance(element, cst.StarredElement)]
            if plain and len(targets) == len(target.elements):
                if self.ctx.matches(iterable.func, "builtins.zip") and len(args) == len(targets):
                    return [(t, arg.value) for t, arg in zip(targets, args)]
                if self.ctx.matches(iterable.func, "builtins.enumerate") and len(args) == 1 and len(targets) == 2:
                    return [(targets[0], None), (targets[1], args[0].value)]
        return [(target, iterable)]

    def _note_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._add_target(node.asname.name, _Definition(self._next_seq(), self._statement_path(), kind=Kind.UNKNOWN))

    def _note_If(self, node: cst.If) -> None:
        if is_main_guard(node):
            # A script: its functions are called from here, not imported by other files.
            self.has_main_guard = True
        for subject, kind, source in self._isinstance_facts(node.test):
            path = (*self.ctx.stack, node.body)
            definition = _Definition(self._next_seq(), path, kind=kind, narrowing=True, source=source)
            self._narrowings.setdefault(dotted(subject), []).append(definition)
        for subject, kind, source in self._failed_test_facts(node.test):
            if node.orelse is not None:  # `if sync or not isinstance(m, DDP): ... else: m.no_sync()`
                path = (*self.ctx.stack, node.orelse)
                definition = _Definition(self._next_seq(), path, kind=kind, narrowing=True, source=source)
            elif _leaves(node):  # `if not isinstance(m, DDP): return`: what follows runs only when it is one
                definition = _Definition(self._next_seq(), self._statement_path(), kind=kind, source=source, after_exit=True)
            else:
                continue
            self._narrowings.setdefault(dotted(subject), []).append(definition)

    def _note_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        """`isinstance(m, FSDP) and m.mixed_precision...`: the right side runs only where the left holds (or, for
        `or`, fails)."""
        facts = self._isinstance_facts if isinstance(node.operator, cst.And) else self._failed_test_facts
        for subject, kind, source in facts(node.left):
            path = (*self.ctx.stack, node.right)
            definition = _Definition(self._next_seq(), path, kind=kind, narrowing=True, source=source)
            self._narrowings.setdefault(dotted(subject), []).append(definition)

    def _note_IfExp(self, node: cst.IfExp) -> None:
        """`m.module if isinstance(m, FSDP) else m`: the body runs where the test holds, the other where it fails."""
        for part, facts in ((node.body, self._isinstance_facts), (node.orelse, self._failed_test_facts)):
            for subject, kind, source in facts(node.test):
                path = (*self.ctx.stack, part)
                definition = _Definition(self._next_seq(), path, kind=kind, narrowing=True, source=source)
                self._narrowings.setdefault(dotted(subject), []).append(definition)

    def _note_While(self, node: cst.While) -> None:
        for subject, kind, source in self._isinstance_facts(node.test):  # `while isinstance(m, FSDP): m = m.module`
            path = (*self.ctx.stack, node.body)
            definition = _Definition(self._next_seq(), path, kind=kind, narrowing=True, source=source)
            self._narrowings.setdefault(dotted(subject), []).append(definition)

    def _note_Assert(self, node: cst.Assert) -> None:
        for subject, kind, source in self._isinstance_facts(node.test):
            definition = _Definition(self._next_seq(), self._statement_path(), kind=kind, source=source)
            self._narrowings.setdefault(dotted(subject), []).append(definition)

    def _note_FunctionDef(self, node: cst.FunctionDef) -> None:
        path = tuple(self.ctx.stack)
        enclosing = [n for n in path[:-1] if isinstance(n, (cst.FunctionDef, cst.ClassDef))]
        self._functions[id(node)] = _Function(node, path, callable_from_elsewhere=not enclosing)
        seq = self._next_seq()
        params = node.params
        positional = [*params.posonly_params, *params.params]
        for param in [*positional, *params.kwonly_params]:
            annotation = param.annotation.annotation if param.annotation else None
            kind = self.annotation_kind(annotation) if annotation else None
            source = self._class_source(annotation) if annotation else None
            self._names[id(param)] = _Definition(seq, (*path, node.body), kind=kind, source=source)
        owner = method_owner(node, path)
        if owner is not None and positional:
            # `self`: an instance of the class the method is defined in.
            self._names[id(positional[0])] = _Definition(seq, (*path, node.body), kind=self._class_definition_kind(owner))
        for param in (params.star_arg, params.star_kwarg):
            if isinstance(param, cst.Param):
                self._names[id(param)] = _Definition(seq, (*path, node.body), kind=Kind.UNKNOWN)

    def _class_definition_kind(self, node: cst.ClassDef) -> Kind:
        kind = self._bases_kind(node)
        return self._assume.get(UNTIED, kind) if kind is Kind.FSDP else kind

    def _bases_kind(self, node: cst.ClassDef) -> Kind:
        """What instances of a class defined in this file are, going by its bases."""
        for base in node.bases:
            kind = self.class_kind(base.value)
            if kind is not None:
                return kind
        return Kind.PLAIN

    def _note_Return(self, node: cst.Return) -> None:
        function = next((n for n in reversed(self.ctx.stack) if isinstance(n, (cst.FunctionDef, cst.Lambda))), None)
        if isinstance(function, cst.FunctionDef) and id(function) in self._functions:
            self._functions[id(function)].returns.append((node.value, tuple(self.ctx.stack)))

    def _note_Call(self, node: cst.Call) -> None:
        if self.ctx.matches(node.func, FSDP_CLASS, MANUAL_WRAP) or (
            node.args and self.ctx.matches(node.func, *_PARTIAL) and self.ctx.matches(node.args[0].value, FSDP_CLASS)
        ):
            self.constructors.append(node)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _STORING and dotted(func.value) and node.args:
            self._store(func.value, _Definition(self._next_seq(), self._statement_path(), node.args[-1].value))
        elif len(node.args) == 3 and dotted(node.args[0].value) and self.ctx.matches(func, "builtins.setattr"):
            # `setattr(net, name, FSDP(child))`: a submodule of `net`, as `net.<name> = ...` would be
            self._store(node.args[0].value, _Definition(self._next_seq(), self._statement_path(), node.args[2].value))
        if isinstance(node.func, cst.Name):
            self._calls.append((node, tuple(self.ctx.stack)))
            self._call_funcs.add(id(node.func))
        stack = self.ctx.stack
        if (
            len(stack) >= 2
            and isinstance(stack[-2], cst.Expr)
            and node.args
            and dotted(node.args[0].value)
            and self.ctx.matches(node.func, *FULLY_SHARD)
        ):
            # `fully_shard(model)` on its own line shards `model` in place.
            definition = _Definition(self._next_seq(), self._statement_path(), kind=Kind.FSDP, source=FSDP2)
            target = node.args[0].value
            if isinstance(target, cst.Name):
                self._narrowings.setdefault(target.value, []).append(definition)
            else:
                self._add_target(target, definition)

    def _note_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted(node.module)
        for alias in node.names:
            self._note_imported(f"{module}.{dotted(alias.name)}")

    def _note_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            self._note_imported(dotted(alias.name))

    def _note_imported(self, qualified: str) -> None:
        # FSDP2 names count too: a rewritten file must be judged as its original was (a re-run reports the same).
        if qualified.startswith(("torch.distributed.fsdp", "torch.distributed._composable.fsdp")):
            self.imports_fsdp = True
        if qualified in DDP_CLASSES:
            self.imports_ddp = True


    # ----- small readers --------------------------------------------------------------------

    def _is_call_to(self, node, qualified: str) -> bool:
        return isinstance(node, cst.Call) and self.ctx.matches(node.func, qualified)

    def _lists_fsdp_modules(self, node) -> str | None:
        """Where the modules come from when `node` lists sharded modules: `FSDP.fsdp_modules(m)`, or
        what MF207 makes of it (`[x for x in m.modules() if isinstance(x, FSDPModule)]`)."""
        if self._is_call_to(node, FSDP_MODULES):
            return UNTIED
        if isinstance(node, cst.Call) and dotted(node.func) == ROOT_MODULES_HELPER:
            return FSDP2
        if isinstance(node, (cst.ListComp, cst.GeneratorExp)) and isinstance(node.elt, cst.Name):
            facts = [fact for condition in node.for_in.ifs for fact in self._isinstance_facts(condition.test)]
            return next(
                (source for subject, kind, source in facts if dotted(subject) == node.elt.value and kind is Kind.FSDP),
                None,
            )
        return None

    def _wraps_itself(self, target, value) -> bool:
        return (
            isinstance(target, cst.Attribute)
            and isinstance(value, cst.Call)
            and bool(value.args)
            and dotted(value.args[0].value) == dotted(target) != ""
        )

    def class_kind(self, node) -> Kind | None:
        """FSDP1 / DDP when `node` names one of those classes (or a tuple of only such classes)."""
        if isinstance(node, cst.Tuple):
            kinds = {self.class_kind(e.value) for e in node.elements}
            return kinds.pop() if len(kinds) == 1 else None
        if self.ctx.matches(node, FSDP_CLASS, *FSDP2_CLASSES):
            return Kind.FSDP
        if self.ctx.matches(node, *DDP_CLASSES):
            return Kind.DDP
        return None

    def annotation_kind(self, annotation) -> Kind | None:
        if isinstance(annotation, cst.SimpleString):
            # "FSDP": a forward reference spelled as a string; resolve the name it spells.
            text = annotation.evaluated_value if isinstance(annotation.evaluated_value, str) else ""
            return self._spelled_class_kind(text.strip())
        if isinstance(annotation, cst.Subscript) and dotted(annotation.value).split(".")[-1] == "Optional":
            element = annotation.slice[0].slice if annotation.slice else None
            return self.annotation_kind(element.value) if isinstance(element, cst.Index) else None
        kind = self.class_kind(annotation)
        if kind is None and isinstance(annotation, cst.Name):
            local = [a.node for a in assignments_of(self.ctx.scope(annotation), annotation.value)]
            if len(local) == 1 and isinstance(local[0], cst.ClassDef):
                return self._class_definition_kind(local[0])
        return kind

    def _spelled_class_kind(self, text: str) -> Kind | None:
        if not text:
            return None
        names = resolve_spelled(self.ctx, text)
        if FSDP_CLASS in names:
            return Kind.FSDP
        if not names.isdisjoint(DDP_CLASSES):
            return Kind.DDP
        return None

    def _class_source(self, node) -> str:
        """FSDP2 when the class (annotation, isinstance tuple) `node` names FSDPModule, else UNTIED."""
        for child, _ in walk(node):
            if isinstance(child, (cst.Name, cst.Attribute)) and self.ctx.matches(child, *FSDP2_CLASSES):
                return FSDP2
        return UNTIED

    def _isinstance_facts(self, test) -> list[tuple[cst.BaseExpression, Kind, str]]:
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            return [*self._isinstance_facts(test.left), *self._isinstance_facts(test.right)]
        if (
            isinstance(test, cst.Call)
            and dotted(test.func) == "isinstance"
            and len(test.args) == 2
            and dotted(test.args[0].value)
        ):
            kind = self.class_kind(test.args[1].value)
            if kind is not None:
                return [(test.args[0].value, kind, self._class_source(test.args[1].value))]
        return []

    def _failed_test_facts(self, test) -> list[tuple[cst.BaseExpression, Kind, str]]:
        """What holds where `test` is false: `not isinstance(...)` fails, as does each side of an `or`; where
        `isinstance(m, FSDP)` fails, `m` is no sharded model (the else branch FSDP1 never ran for its models)."""
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            return [*self._failed_test_facts(test.left), *self._failed_test_facts(test.right)]
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._isinstance_facts(test.expression)
        facts = self._isinstance_facts(test) if isinstance(test, cst.Call) else []
        if len(facts) == 1 and facts[0][1] is Kind.FSDP and not isinstance(test.args[1].value, cst.Tuple):
            return [(facts[0][0], Kind.PLAIN, facts[0][2])]
        return []

    # ----- answering ------------------------------------------------------------------------

    def kind(self, node, stack=None) -> Kind:
        """What the Name/Attribute chain `node` holds where it is used (`stack`: its original ancestors)."""
        return self._kind(node, tuple(stack if stack is not None else self.ctx.stack), 0)

    def _kind(self, node, path: tuple, depth: int) -> Kind:
        if depth > _MAX_DEPTH:
            return Kind.UNKNOWN
        key = (id(node), id(path[-1]) if path else 0, depth)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = Kind.UNKNOWN  # recursion guard
        result = self._compute_kind(node, path, depth)
        self._memo[key] = result
        return result

    def _compute_kind(self, node, path, depth) -> Kind:
        chain = dotted(node)
        narrowed = self._narrowed(chain, path)
        if narrowed is not None:
            return narrowed
        if isinstance(node, cst.Name):
            return self._name_kind(node, path, depth)
        if isinstance(node, cst.Attribute) and chain:
            return self._chain_kind(node, path, depth)
        return Kind.UNKNOWN

    def _narrowed(self, chain: str, path: tuple) -> Kind | None:
        best = None
        for definition in self._narrowings.get(chain, ()):
            if definition.narrowing:
                inside = len(path) >= len(definition.path) and all(
                    a is b for a, b in zip(definition.path, path, strict=False)
                )
                if inside and (best is None or definition.seq > best.seq):
                    best = definition
            elif self._relation(definition, path) == "definite" and (best is None or definition.seq > best.seq):
                best = definition
        return self._fixed(best) if best is not None else None

    def _name_kind(self, node: cst.Name, path, depth) -> Kind:
        scope = self.ctx.scope(node)
        assignments = assignments_of(scope, node.value)
        definitions = []
        for assignment in assignments:
            definition = self._names.get(id(assignment.node))
            if definition is None:  # imports, defs, classes, comprehension targets...
                definition = _Definition(0, (), kind=Kind.PLAIN if self._is_definition(assignment.node) else Kind.UNKNOWN)
            definitions.append((assignment, definition))
        if not definitions:
            return Kind.UNKNOWN
        flow_scope = scope
        while isinstance(flow_scope, ComprehensionScope):  # runs where it stands, like the code around it
            flow_scope = flow_scope.parent
        same_scope = [d for a, d in definitions if a.scope is flow_scope]
        if same_scope:
            reaching = self._reaching(same_scope, path)
            if reaching is None:  # nothing before the use in this scope
                return Kind.UNKNOWN
        else:
            reaching = self._reaching_at_end([d for _, d in definitions])
        return combine(self._definition_kind(d, node, depth) for d in reaching)

    @staticmethod
    def _is_definition(node) -> bool:
        return isinstance(node, (cst.FunctionDef, cst.ClassDef))

    def _chain_kind(self, node: cst.Attribute, path, depth) -> Kind:
        owner = self._chain_owner(node, path)
        definitions = self._chains.get((owner, dotted(node)), [])
        if not definitions:
            return Kind.UNKNOWN
        function = next((n for n in reversed(path) if isinstance(n, cst.FunctionDef)), None)
        local = [d for d in definitions if d.function is function]
        elsewhere = [d for d in definitions if d.function is not function]
        reaching = self._reaching(local, path) if local else None
        if reaching is not None and any(self._relation(d, path) == "definite" for d in local):
            return combine(self._definition_kind(d, node, depth) for d in reaching)
        candidates = [*(reaching or []), *elsewhere]
        kinds = [self._definition_kind(d, node, depth) for d in candidates]
        if any(d.wraps_itself and self._definition_kind(d, node, depth) is Kind.FSDP for d in candidates):
            # `self.model = FSDP(self.model)`: other assignments hold the module before wrapping.
            kinds = [k if k is not Kind.UNKNOWN else Kind.PLAIN for k in kinds]
        return combine(kinds)

    def _reaching(self, definitions, path) -> list | None:
        """Definitions that may reach a use at `path`: the last definite one and conditional ones after it."""
        before = []
        for definition in definitions:
            relation = self._relation(definition, path)
            if relation is not None:
                before.append((definition, relation))
        if not before:
            return None
        before.sort(key=lambda item: item[0].seq)
        last_definite = max((i for i, (_, r) in enumerate(before) if r == "definite"), default=None)
        if last_definite is None:
            # Reached by conditional assignments only: what held before them is unknown.
            return [d for d, _ in before] + [_Definition(0, (), kind=Kind.UNKNOWN)]
        return [d for d, _ in before[last_definite:]]

    def _reaching_at_end(self, definitions) -> list:
        """For a use in a nested function: the values the outer scope's name can hold once set up."""
        ordered = sorted(definitions, key=lambda d: d.seq)
        top = [
            i
            for i, d in enumerate(ordered)
            if not any(isinstance(n, _CONDITIONAL) and not is_main_guard(n) for n in self._inner_path(d))
        ]
        return ordered[top[-1] :] if top else ordered + [_Definition(0, (), kind=Kind.UNKNOWN)]

    @staticmethod
    def _inner_path(definition) -> tuple:
        """The part of a definition's path inside its own function (or module)."""
        path = definition.path
        for index in range(len(path) - 1, -1, -1):
            if isinstance(path[index], (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return path[index + 1 :]
        return path

    def _relation(self, definition, path) -> str | None:
        """"definite"/"maybe" when `definition` runs before a use at `path`, None when it does not."""
        def_path = definition.path
        if not def_path:
            return "definite"
        if _innermost_scope(def_path) is not _innermost_scope(path):
            return None  # another function's flow
        k = 0
        while k < len(def_path) and k < len(path) and def_path[k] is path[k]:
            k += 1
        if k == len(def_path):
            # The use is inside the defining statement: a parameter's body, or `m = FSDP(m)` itself.
            return "definite" if isinstance(def_path[-1], cst.IndentedBlock) else None
        if k == len(path) or k == 0:
            return None
        parent, mine, theirs = def_path[k - 1], def_path[k], path[k]
        order = {id(child): index for index, child in enumerate(children(parent))}
        if id(mine) not in order or id(theirs) not in order or order[id(mine)] > order[id(theirs)]:
            return None
        if isinstance(parent, cst.If) and mine is parent.body and theirs is parent.orelse:
            return None  # exclusive branches
        conditional = any(isinstance(n, _CONDITIONAL) for n in def_path[k:-1]) or (
            isinstance(def_path[-1], (cst.If, cst.For, cst.While)) and not definition.after_exit
        )
        if isinstance(parent, (cst.For, cst.While, cst.Try, cst.If)):
            conditional = True
        return "maybe" if conditional else "definite"

    def _fixed(self, definition: _Definition) -> Kind:
        """A definition's kind known without evaluation, under the assumptions of a trace."""
        if definition.kind is Kind.FSDP:
            return self._assume.get(definition.source or UNTIED, Kind.FSDP)
        return definition.kind

    def _definition_kind(self, definition: _Definition, used, depth) -> Kind:
        if definition.kind is not None:
            return self._fixed(definition)
        if definition.value is None:
            return self._parameter_kind(definition, used, depth)
        if definition.element is not None:
            return self._element_kind(definition.value, definition.element, depth + 1)
        return self.value_kind(definition.value, definition.path, depth + 1)

    def _element_kind(self, value, index: int, depth) -> Kind:
        """Element `index` of `value`, for `model, optim = build()` where `build` returns a tuple."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return Kind.UNKNOWN
        kinds = []
        for assignment in assignments_of(self.ctx.scope(value.func), value.func.value):
            function = self._functions.get(id(assignment.node))
            if function is None or not function.returns:
                return Kind.UNKNOWN
            for returned, path in function.returns:
                if not isinstance(returned, cst.Tuple) or len(returned.elements) <= index:
                    return Kind.UNKNOWN
                kinds.append(self.value_kind(returned.elements[index].value, path, depth + 1))
        return combine(kinds)

    def value_kind(self, value, path, depth=0) -> Kind:
        """What evaluating the original expression `value` at `path` gives."""
        if depth > _MAX_DEPTH:
            return Kind.UNKNOWN
        if isinstance(value, (cst.Name, cst.Attribute)):
            if self.class_kind(value) is not None or self.ctx.qualified_names(value) & {"builtins.None"}:
                return Kind.PLAIN
            return self._kind(value, path, depth + 1)
        if isinstance(value, cst.IfExp):
            return combine([self.value_kind(value.body, path, depth + 1), self.value_kind(value.orelse, path, depth + 1)])
        if isinstance(value, (cst.BaseNumber, cst.BaseString, cst.BaseList, cst.BaseDict, cst.BaseSet, cst.Tuple)):
            return Kind.PLAIN
        if isinstance(value, cst.Call):
            return self._call_kind(value, path, depth)
        return Kind.UNKNOWN

    def _call_kind(self, call: cst.Call, path, depth) -> Kind:
        if id(call) in self._assume:
            return self._assume[id(call)]
        func = call.func
        wrapper = self.class_kind(func)
        if wrapper is not None:
            return wrapper
        if self.ctx.matches(func, *FULLY_SHARD):
            return self._assume.get(FSDP2, Kind.FSDP)
        if isinstance(func, cst.Attribute) and func.attr.value in _RETURNS_SELF:
            return self.value_kind(func.value, path, depth + 1)
        names = self.ctx.qualified_names(func)
        if any(n.startswith("torch.nn.") and not n.startswith("torch.nn.parallel") for n in names):
            return Kind.PLAIN
        if isinstance(func, cst.Name):
            return self._local_callable_kind(func, path, depth)
        return Kind.UNKNOWN

    def _local_callable_kind(self, func: cst.Name, path, depth) -> Kind:
        """A call of a name bound in this file: a partial of FSDP, a local function, a local class."""
        assignments = assignments_of(self.ctx.scope(func), func.value)
        if not assignments:
            return Kind.UNKNOWN
        kinds = []
        for assignment in assignments:
            node = assignment.node
            if isinstance(node, cst.ClassDef):
                kinds.append(self._class_definition_kind(node))
            elif isinstance(node, cst.FunctionDef) and id(node) in self._functions:
                kinds.append(self._returns_kind(self._functions[id(node)], depth))
            elif id(node) in self._names and self._names[id(node)].value is not None:
                kinds.append(self._factory_kind(self._names[id(node)].value))
            else:
                kinds.append(Kind.UNKNOWN)
        return combine(kinds)

    def _factory_kind(self, value) -> Kind:
        """`functools.partial(FSDP, ...)` makes FSDP1 models when called."""
        if id(value) in self._assume:
            return self._assume[id(value)]
        if isinstance(value, cst.Call) and self.ctx.matches(value.func, *_PARTIAL) and value.args:
            return self.class_kind(value.args[0].value) or Kind.UNKNOWN
        return self.class_kind(value) or Kind.UNKNOWN

    def _returns_kind(self, function: _Function, depth) -> Kind:
        if not function.returns:
            return Kind.PLAIN
        kinds = []
        for value, path in function.returns:
            kinds.append(Kind.PLAIN if value is None else self.value_kind(value, path, depth + 1))
        return combine(kinds)

    def _parameter_kind(self, definition: _Definition, used, depth) -> Kind:
        """An unannotated parameter: what every call of its function in this file passes."""
        function_node = definition.path[-2] if len(definition.path) >= 2 else None
        info = self._functions.get(id(function_node))
        if info is None or not isinstance(used, cst.Name):
            return Kind.UNKNOWN
        if info.callable_from_elsewhere and not (self.has_main_guard or info.node.name.value.startswith("_")):
            return Kind.UNKNOWN
        if info.node.decorators or self._is_method(info):
            return Kind.UNKNOWN
        index, name = self._param_position(info.node, used.value)
        if name is None:
            return Kind.UNKNOWN
        kinds = []
        for call, call_path in self._calls:
            if not self._calls_function(call, info.node):
                continue
            argument = self._argument(call, index, name)
            if argument is None:
                return Kind.UNKNOWN
            kinds.append(self.value_kind(argument, call_path, depth + 1))
        if not kinds or self._escapes(info.node):
            return Kind.UNKNOWN
        return combine(kinds)

    @staticmethod
    def _is_method(info: _Function) -> bool:
        return any(isinstance(n, cst.ClassDef) for n in info.path[-3:-1])

    @staticmethod
    def _param_position(function: cst.FunctionDef, name: str):
        positional = [*function.params.posonly_params, *function.params.params]
        for index, param in enumerate(positional):
            if param.name.value == name:
                return index, name
        if any(param.name.value == name for param in function.params.kwonly_params):
            return None, name
        return None, None

    def _calls_function(self, call: cst.Call, function: cst.FunctionDef) -> bool:
        return any(a.node is function for a in assignments_of(self.ctx.scope(call.func), call.func.value))

    @staticmethod
    def _argument(call: cst.Call, index, name):
        for position, arg in enumerate(call.args):
            if arg.star:
                return None
            if arg.keyword is not None:
                if arg.keyword.value == name:
                    return arg.value
            elif position == index:
                return arg.value
        return None

    def _escapes(self, function: cst.FunctionDef) -> bool:
        """The function is used other than by being called (passed as a callback, exported)."""
        assignments = assignments_of(self.ctx.scope(function), function.name.value)
        if not assignments:
            return True
        for assignment in assignments:
            if assignment.node is not function:
                continue
            if any(id(access.node) not in self._call_funcs for access in assignment.references):
                return True
        return False

    # ----- conveniences for rules -----------------------------------------------------------

    def wrapped_here(self, node: cst.Name, stack) -> bool:
        """`node` holds an FSDP1 wrapper this very function created (`model = FSDP(module)` reaches it)."""
        scope = self.ctx.scope(node)
        definitions = [
            self._names[id(a.node)]
            for a in assignments_of(scope, node.value)
            if a.scope is scope and id(a.node) in self._names
        ]
        reaching = self._reaching(definitions, tuple(stack)) or []
        return bool(reaching) and all(
            isinstance(d.value, cst.Call) and d.element is None and self._call_kind(d.value, d.path, 0) is Kind.FSDP
            for d in reaching
        )

    def origins(self, node, stack) -> "Origins | None":
        """Where the sharded model `node` holds at `stack` comes from; None when it is not one.

        Traced by asking again under assumptions: a source taken to give an
        unknown value makes the answer unknown exactly when that source reaches.
        """
        if self.kind(node, stack) is not Kind.FSDP:
            return None
        return self._traced_origins(lambda: self.kind(node, stack) is Kind.FSDP)

    def _traced_origins(self, sharded) -> Origins:
        """The sources `sharded()` (true as things are) depends on, found by asking it again under assumptions."""
        ties = frozenset(c for c in self.constructors if not self._assuming({id(c): Kind.UNKNOWN}, sharded))
        fsdp2 = not self._assuming({FSDP2: Kind.UNKNOWN}, sharded)
        out_of_sight = {id(c): Kind.PLAIN for c in self.constructors} | {FSDP2: Kind.PLAIN}
        return Origins(ties, fsdp2, self._assuming(out_of_sight, sharded))

    def holder_origins(self, node, stack, module: bool = False) -> "Origins | None":
        """Where the sharded models come from that the module `node` holds as submodules (`teacher["backbone"] =
        FSDP(...)`, `self.student.head = FSDP(...)`, `nn.ModuleList([FSDP(b) for b in blocks])`), or that its
        element `node` (`d[k]`) is; None when it holds none. Its `state_dict()` then gathers each FSDP1 child's
        full tensors, where FSDP2's are DTensor shards. `module`: `node` is known to be a module (FSDP wraps it)."""
        held = self._held(node, tuple(stack), module)

        def holds() -> bool:
            return any(self._definition_kind(d, None, 1) is Kind.FSDP for d in held)

        return self._traced_origins(holds) if held and self._assuming({}, holds) else None

    def _held(self, node, path, module: bool = False) -> list:
        """What may be stored in the module `node` names, as definitions of those values."""
        element = isinstance(node, cst.Subscript)
        while isinstance(node, cst.Subscript):  # an element of a container: a sharded model, or a holder of some
            node = node.value
        if not dotted(node):
            return []
        keys = self._keys(node, path)
        held = [
            d
            for table, deeper in ((self._stores, ""), (self._chains, "."))
            for (owner, chain, _) in keys
            for (key_owner, key), definitions in table.items()
            if key_owner == owner and (key == chain + deeper or key.startswith(chain + "."))
            for d in definitions
        ]
        if not element and not module and not self._is_module(keys, node, path):
            held = []
        if isinstance(node, cst.Name) or len(keys) == 1:
            held += [d for definition in self._definitions_of(node, path) for d in self._built_holding(definition)]
        return held + [d for definition in held for d in self._built_holding(definition)]

    def _keys(self, node, path) -> list:
        """(owner, chain, class) under which what the module `node` holds is recorded: its own chain, and
        `self.<rest>` of a class of this file whose instance a prefix of it is (`m.teacher` of `m = Meta()`)."""
        keys = [(self._chain_owner(node, path), dotted(node), None)]
        if isinstance(node, cst.Name):
            function = next((n for n in reversed(path) if isinstance(n, cst.FunctionDef)), None)
            owner = method_owner(function, path[: path.index(function) + 1]) if function is not None else None
            positional = [*function.params.posonly_params, *function.params.params] if owner is not None else []
            if positional and positional[0].name.value == node.value:
                keys = [(id(owner), "self", owner)]
        base, rest = node, []
        while True:
            for definition in self._definitions_of(base, path):
                instance_of = self._local_class(definition.value.func) if isinstance(definition.value, cst.Call) else None
                if instance_of is not None:
                    keys.append((id(instance_of), ".".join(["self", *rest]), instance_of if not rest else None))
            if not isinstance(base, cst.Attribute):
                return keys
            rest.insert(0, base.attr.value)
            base = base.value

    def _definitions_of(self, node, path) -> list:
        if isinstance(node, cst.Name):
            return [self._names[id(a.node)] for a in assignments_of(self.ctx.scope(node), node.value) if id(a.node) in self._names]
        owner = self._chain_owner(node, path)
        return list(self._chains.get((owner, dotted(node)), ()))

    def _built_holding(self, definition) -> list:
        """Definitions of the modules an `nn.ModuleDict({...})`, `nn.ModuleList([...])` or `nn.Sequential(...)`
        that `definition` builds holds."""
        value = definition.value
        if isinstance(value, (cst.List, cst.Tuple, cst.ListComp)):  # `layers = [FSDP(m) for m in net]`
            return [_Definition(definition.seq, definition.path, e) for e in _elements(value)]
        if not isinstance(value, cst.Call) or not self.ctx.matches(value.func, *_CONTAINERS):
            return []
        return [_Definition(definition.seq, definition.path, e) for arg in value.args for e in _elements(arg.value)]

    def _local_class(self, func) -> cst.ClassDef | None:
        if not isinstance(func, cst.Name):
            return None
        classes = [a.node for a in assignments_of(self.ctx.scope(func), func.value) if isinstance(a.node, cst.ClassDef)]
        return classes[0] if len(classes) == 1 else None

    def _is_module(self, keys, node, path) -> bool:
        """`node` holds an `nn.Module` (its attributes are submodules, its `state_dict()` is torch's): `self` or an
        instance of a module class, or a value built by a torch.nn class or a module class of this file."""
        for owner, chain, instance_of in keys:
            if instance_of is not None:
                return self._is_module_class(instance_of)
            definitions = self._chains.get((owner, chain), ()) if chain != dotted(node) else self._definitions_of(node, path)
            if self._all_build_modules(definitions):
                return True
        return False

    def built_in_sight(self, node, stack) -> bool:
        """The module `node` names is built here, by torch.nn or a module class of this file (`nn.Sequential(...)`,
        `net = Net()`), so what it holds is in sight; not one a function or a caller hands over."""
        if isinstance(node, cst.Call):
            return self._builds_module(node.func)
        return isinstance(node, cst.Name) and self._all_build_modules(self._definitions_of(node, tuple(stack)))

    def _all_build_modules(self, definitions) -> bool:
        """Each of `definitions` builds a module; an FSDP(...) of it counts as one too (`model = FSDP(model)`
        after `model[i] = FSDP(model[i])`), but not alone."""
        built = [d for d in definitions if not any(d.value is c for c in self.constructors)]
        return bool(built) and all(isinstance(d.value, cst.Call) and self._builds_module(d.value.func) for d in built)

    def _builds_module(self, func) -> bool:
        local = self._local_class(func)
        if local is not None:
            return self._is_module_class(local)
        return any(n.startswith("torch.nn.") and n[9:10].isupper() for n in self.ctx.qualified_names(func))

    def _is_module_class(self, node: cst.ClassDef) -> bool:
        return any(self._builds_module(base.value) for base in node.bases)

    def is_fsdp2_module(self, node, stack) -> bool:
        """`node` holds an FSDP2 module and nothing else: its own methods are not FSDP1 API."""
        origins = self.origins(node, tuple(stack))
        return origins is not None and origins.fsdp2 and not origins.constructors and not origins.untied

    def _assuming(self, assume: dict, question):
        """`question()` answered afresh with `assume` in force (see `_assume`)."""
        saved = self._memo, self._assume
        self._memo, self._assume = {}, assume
        try:
            return question()
        finally:
            self._memo, self._assume = saved

    def is_fsdp_model(self, node, stack=None) -> bool:
        return isinstance(node, (cst.Name, cst.Attribute)) and self.kind(node, stack) is Kind.FSDP

    @property
    def file_may_hold_ddp(self) -> bool:
        """The file uses DDP and nothing of FSDP: a `.no_sync()` of unknown origin is presumably DDP's."""
        return self.imports_ddp and not self.imports_fsdp


def _leaves(node: cst.If) -> bool:
    """An `if` whose body always ends its block (return, raise, continue, break)."""
    body = node.body.body
    last = body[-1] if body else None
    if not isinstance(last, cst.SimpleStatementLine):
        return False
    return isinstance(last.body[-1], (cst.Return, cst.Raise, cst.Continue, cst.Break))


def _elements(node) -> list:
    """The modules a container's argument lists: dict values, list elements, a comprehension's element."""
    if isinstance(node, cst.Dict):
        return [e.value for e in node.elements if isinstance(e, cst.DictElement)]
    if isinstance(node, (cst.List, cst.Tuple)):
        return [e.value for e in node.elements if not isinstance(e, cst.StarredElement)]
    if isinstance(node, (cst.ListComp, cst.GeneratorExp)):
        return [node.elt]
    if isinstance(node, cst.DictComp):
        return [node.value]
    return [node]


FACTS_KEY = "training.fsdp_models"


def fsdp_models(ctx) -> FsdpModels:
    if FACTS_KEY not in ctx.facts:
        ctx.facts[FACTS_KEY] = FsdpModels(ctx)
    return ctx.facts[FACTS_KEY]
