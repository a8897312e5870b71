"""Where a setting defined apart from its FSDP(...) call goes, across the modules of the program.

Recipes define their FSDP1 settings in a module of their own (`bf16 =
MixedPrecision(...)` in `policies.py`), hand them out through a function
(`return mixed_precision_policy, wrapping_policy`) and pass them on at run
time (`mixed_precision=mp if cfg.mixed_precision else None`). Such a
definition can take its FSDP2 form where it stands only if every place its
value can reach is a constructor that converts and reads it through a helper
taking both forms; anywhere else (FSDP1 code that stays, a library's plugin,
an attribute read) the FSDP1 object must stay what it is.

The value is followed forward: through assignments to a plain name,
conditional and boolean expressions, `return` (also as an element of a
returned tuple that the caller unpacks), every call of the function that
returns it (in its file, or imported by another module), every import of a
module-level name (also through a package's star re-exports) and read
through an imported module (`policies.bf16`), an attribute of `self` that
only its class reads (`self.strategy = ShardingStrategy.X`, then
`sharding_strategy=self.strategy`), the result of a method at every call of
it in the program, into an argument of a function
of the program (`setup(model, auto_wrap_policy=policy)`: its parameter is
followed there), and into a keyword argument of any other call (a
constructor's, an `_or_policy`'s `policies=[...]`, or
`apply_activation_checkpointing(auto_wrap_policy=...)`, which takes only a
function policy: decide judges them).
Printing it is harmless. Anything else it meets means it may reach code out
of sight.
"""

import re
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ClassScope, GlobalScope

from migrate_fsdp.rewrite.analysis.escapes import argument_binding, bound_parameter, local_function
from migrate_fsdp.rewrite.analysis.models import assignments_of
from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls
from migrate_fsdp.rewrite.syntax import dotted, walk

Position = tuple[int, int]
_HARMLESS = ("builtins.print",)
_CHECKPOINTING = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing"
_STAR_DEPTH = 4  # packages re-exporting modules that re-export modules...


@dataclass(frozen=True)
class Sink:
    """A keyword argument of a call (an FSDP(...) constructor, for the value to convert) that the value reaches."""

    path: str
    call: Position
    keyword: str
    checkpointing: bool = False  # `apply_activation_checkpointing(auto_wrap_policy=...)`: it takes FSDP1's form


class _OutOfSight(Exception):
    """The value may reach code the program cannot follow."""


class ValueFlow:
    """Follows values through the program's files, each parsed at most once (shared with RemoteCalls)."""

    def __init__(self, calls: RemoteCalls) -> None:
        self.calls = calls
        self._parents: dict[str, dict[int, cst.CSTNode]] = {}

    def sinks(self, path: str, position: Position) -> frozenset[Sink] | None:
        """Every keyword argument the value of the call (or attribute: `ShardingStrategy.X`) at `position` in `path`
        reaches; None: out of sight."""
        ctx = self.calls.context(path)
        built = None if ctx is None else next(
            (n for n, _ in walk(ctx.module) if isinstance(n, (cst.Call, cst.Attribute)) and ctx.position(n) == position), None
        )
        if built is None:
            return None
        found: set[Sink] = set()
        try:
            self._value(path, built, found, set())
        except (_OutOfSight, RecursionError):
            return None
        return frozenset(found)

    # ----- the places a value can be -------------------------------------------------

    def _binding(self, path: str, name: cst.Name, found: set, seen: set, held: bool = False) -> None:
        """`name = value`: wherever the name is read (`held`: the name holds a container of the value)."""
        if (path, id(name), held) in seen:
            return
        seen.add((path, id(name), held))
        ctx = self.calls.context(path)
        scope = ctx.scope(name)
        if scope is None or isinstance(scope, ClassScope):
            raise _OutOfSight
        assignment = next((a for a in assignments_of(scope, name.value) if a.node is name or getattr(a.node, "name", None) is name), None)
        if assignment is None:
            raise _OutOfSight
        for access in assignment.references:
            self._value(path, access.node, found, seen, held)
        if isinstance(scope, GlobalScope):
            self._imported(path, name.value, lambda where, node: self._value(where, node, found, seen, held))

    def _value(self, path: str, node: cst.CSTNode, found: set, seen: set, held: bool | str = False) -> None:
        """An expression holding the value (`held`: a dict, list or tuple with it among its values; the key, for a
        dict holding it under a string key): where does its value go? A container is followed only to its
        subscripts (`PRECISION[args.precision]`), a dict keyed by strings also to the calls taking it as `**kw`."""
        parents = self._parents_of(path)
        parent = parents.get(id(node))
        if held:
            if isinstance(held, str) and isinstance(parent, cst.Arg) and parent.value is node and parent.star == "**":
                call = parents.get(id(parent))
                found.add(Sink(path, self.calls.context(path).position(call), held))  # `FSDP(model, **kw)`
            elif isinstance(parent, cst.Subscript) and parent.value is node:
                self._value(path, parent, found, seen)
            elif isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node:
                self._bound(path, parent, found, seen, held)
            elif held is True and isinstance(parent, cst.Arg) and parent.value is node and parent.keyword is not None:
                self._argument(path, parent, found, seen)  # `policies = [a, b]`, then `partial(_or_policy, policies=policies)`
            else:
                raise _OutOfSight
            return
        while isinstance(parent, (cst.IfExp, cst.BooleanOperation)) and getattr(parent, "test", None) is not node:
            node, parent = parent, parents.get(id(parent))
        if isinstance(parent, (cst.Assign, cst.AnnAssign)) and parent.value is node:
            self._bound(path, parent, found, seen, held)
        elif isinstance(parent, cst.DictElement) and parent.value is node:
            key = parent.key.evaluated_value if isinstance(parent.key, cst.SimpleString) else None
            self._value(path, parents[id(parent)], found, seen, held=key if isinstance(key, str) else True)
        elif isinstance(parent, cst.Return):
            self._returned(path, parent, None, found, seen)
        elif isinstance(parent, cst.Element) and isinstance(parents.get(id(parent)), (cst.Tuple, cst.List)):
            values = parents[id(parent)]
            holder = parents.get(id(values))
            if isinstance(holder, cst.Return) and holder.value is values and isinstance(values, cst.Tuple) and not _starred(values):
                self._returned(path, holder, values.elements.index(parent), found, seen)
            elif isinstance(holder, cst.Arg) and holder.value is values:  # `policies=[a, b]`: the call takes them all
                self._argument(path, holder, found, seen)
            else:
                self._value(path, values, found, seen, held=True)
        elif isinstance(parent, cst.Arg) and parent.value is node:
            self._argument(path, parent, found, seen)
        elif isinstance(parent, cst.Param) and parent.default is node:  # `def shard(m, strategy=<the value>)`
            self._binding(path, parent.name, found, seen)
        else:
            raise _OutOfSight

    def _bound(self, path: str, statement, found: set, seen: set, held: bool) -> None:
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        if len(targets) == 1 and _of_self(targets[0]):
            self._held_on_self(path, statement, targets[0].attr.value, found, seen, held)
            return
        if len(targets) != 1 or not isinstance(targets[0], cst.Name):
            raise _OutOfSight
        self._binding(path, targets[0], found, seen, held)

    def _held_on_self(self, path: str, statement, attribute: str, found: set, seen: set, held: bool) -> None:
        """`self.strategy = value` in a method: wherever the class reads `self.strategy`, when no other code of the
        program spells the attribute's name (an object's attribute read anywhere else may be this one)."""
        parents = self._parents_of(path)
        method = parents.get(id(statement))
        while method is not None and not isinstance(method, cst.FunctionDef):
            method = parents.get(id(method))
        owner = parents.get(id(parents.get(id(method)))) if method is not None else None
        first = method.params.params[0].name.value if method is not None and method.params.params else None
        if not isinstance(owner, cst.ClassDef) or first != "self":
            raise _OutOfSight
        key = (path, id(owner), attribute, held)
        if key in seen:
            return
        seen.add(key)
        spelled = [n for n, _ in walk(owner) if _of_self(n) and n.attr.value == attribute]
        word = re.compile(rb"\b" + re.escape(attribute.encode()) + rb"\b")
        if sum(len(word.findall(data)) for data in self.calls.sources.values()) != len(spelled):
            raise _OutOfSight
        for node in spelled:
            if not isinstance(parents.get(id(node)), cst.AssignTarget):
                self._value(path, node, found, seen, held)

    def _argument(self, path: str, arg: cst.Arg, found: set, seen: set) -> None:
        ctx, call = self.calls.context(path), self._parents_of(path).get(id(arg))
        if not isinstance(call, cst.Call):
            raise _OutOfSight  # a class's base
        if ctx.matches(call.func, *_HARMLESS):
            return
        callee = self._program_function(path, ctx, call)
        if callee is not None:  # `setup(model, auto_wrap_policy=policy)`: where its parameter goes there
            binding = argument_binding(call, arg)
            parameter = bound_parameter(callee[1], *binding) if binding is not None else None
            if parameter is None:
                raise _OutOfSight
            self._binding(callee[0], parameter, found, seen)
            return
        if arg.keyword is None or arg.star:
            raise _OutOfSight
        if ctx.matches(call.func, "builtins.dict"):  # `kw = dict(auto_wrap_policy=policy)`: an item keyed by its name
            self._value(path, call, found, seen, held=arg.keyword.value)
            return
        checkpointing = ctx.matches(call.func, _CHECKPOINTING) and arg.keyword.value == "auto_wrap_policy"
        found.add(Sink(path, ctx.position(call), arg.keyword.value, checkpointing))

    def _program_function(self, path: str, ctx, call: cst.Call) -> tuple[str, cst.FunctionDef] | None:
        """(its file, the function) when `call` runs a function of the program: of its file or imported."""
        local = local_function(ctx, call.func)
        if local is not None:
            return path, local
        names = ctx.qualified_names(call.func)
        qualified = next(iter(names)) if len(names) == 1 else ""
        if "." not in qualified.lstrip(".") or qualified.startswith(("builtins.", "torch.", "functools.")):
            return None
        return self.calls.called(path, qualified)

    def _returned(self, path: str, ret: cst.Return, index: int | None, found: set, seen: set) -> None:
        """Returned by a module-level function (element `index` of a tuple): wherever its calls' results go."""
        ctx, parents = self.calls.context(path), self._parents_of(path)
        function = parents.get(id(ret))
        while function is not None and not isinstance(function, (cst.FunctionDef, cst.Lambda)):
            function = parents.get(id(function))
        if not isinstance(function, cst.FunctionDef) or function.decorators:
            raise _OutOfSight
        key = (path, id(function), index)
        if key in seen:
            return
        seen.add(key)
        if isinstance(parents.get(id(parents.get(id(function)))), cst.ClassDef):
            self._method_returned(function.name.value, index, found, seen)
            return
        if not isinstance(parents.get(id(function)), cst.Module):
            raise _OutOfSight
        assignment = next((a for a in assignments_of(ctx.scope(function), function.name.value) if a.node is function), None)
        if assignment is None:
            raise _OutOfSight
        for access in assignment.references:
            self._called(path, access.node, index, found, seen)
        self._imported(path, function.name.value, lambda where, node: self._called(where, node, index, found, seen))

    def _method_returned(self, name: str, index: int | None, found: set, seen: set) -> None:
        """Returned by a method: wherever the result of every `x.name()` of the program goes (any receiver: the
        program cannot tell which class's method runs), when nothing else spells the name (a method handed on) and
        the program calls it at all (else it is a hook of code out of sight)."""
        word = re.compile(rb"\b" + re.escape(name.encode()) + rb"\b")
        calls = []
        for other, data in self.calls.sources.items():
            spelt = len(word.findall(data))
            if not spelt:
                continue
            ctx = self.calls.context(other)
            if ctx is None:
                raise _OutOfSight
            parents = self._parents_of(other)
            defined = [n for n, _ in walk(ctx.module) if isinstance(n, cst.FunctionDef) and n.name.value == name]
            called = [
                n
                for n, _ in walk(ctx.module)
                if isinstance(n, cst.Attribute) and n.attr.value == name and isinstance(parents.get(id(n)), cst.Call)
                and parents[id(n)].func is n
            ]
            if spelt != len(defined) + len(called):
                raise _OutOfSight
            calls += [(other, node) for node in called]
        if not calls:
            raise _OutOfSight  # a hook a framework calls (a plugin's `mixed_precision_config()`)
        for other, node in calls:
            self._called(other, node, index, found, seen)

    def _called(self, path: str, node: cst.CSTNode, index: int | None, found: set, seen: set) -> None:
        """`node` names the function returning the value: it must be called, and the result followed."""
        parents = self._parents_of(path)
        call = parents.get(id(node))
        if not (isinstance(call, cst.Call) and call.func is node):
            raise _OutOfSight
        if index is None:
            self._value(path, call, found, seen)
            return
        statement = parents.get(id(call))
        if isinstance(statement, cst.Subscript) and statement.value is call:  # `get_policies(cfg)[0]`
            if _literal_index(statement) != index:
                raise _OutOfSight
            self._value(path, statement, found, seen)
            return
        if not (isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1):
            raise _OutOfSight
        target = statement.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)) or _starred(target) or index >= len(target.elements):
            raise _OutOfSight
        name = target.elements[index].value
        if not isinstance(name, cst.Name):
            raise _OutOfSight
        self._binding(path, name, found, seen)

    # ----- other modules ---------------------------------------------------------------

    def _imported(self, path: str, name: str, read) -> None:
        """Every read, in another module, of the module-level `name` of `path` (`read(where, node)` follows it)."""
        spelled = name.encode()
        for other, data in self.calls.sources.items():
            if other == path or spelled not in data:
                continue
            ctx = self.calls.context(other)
            if ctx is None:
                raise _OutOfSight
            handled = self._through_imports(other, ctx, name, path, read)
            for node, ancestors in walk(ctx.module):
                if isinstance(node, cst.Name) and node.value == name and id(node) not in handled:
                    self._stray(other, ctx, node, ancestors, path, read)
                elif isinstance(node, cst.Attribute) and node.attr.value == name:
                    self._attribute(other, ctx, node, path, read)

    def _through_imports(self, path: str, ctx, name: str, defined: str, read) -> set[int]:
        """Follows the reads of every `from ... import name [as alias]` of `path` that finds `defined`'s name;
        the ids of the names read."""
        handled: set[int] = set()
        for node, _ in walk(ctx.module):
            if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
                continue
            for alias in node.names:
                if dotted(alias.name) != name or self._defined_in(path, node, name) != defined:
                    continue
                bound = alias.asname.name.value if alias.asname else name
                for assignment in assignments_of(ctx.scope(node), bound):
                    if assignment.node is node:
                        handled.update(id(access.node) for access in assignment.references)
                        for access in assignment.references:
                            read(path, access.node)
        return handled

    def _attribute(self, path: str, ctx, node: cst.Attribute, defined: str, read) -> None:
        """`policies.bf16`: a read of the definition when `policies` is an imported module of the program defining it."""
        names = ctx.qualified_names(node)
        if len(names) != 1:
            raise _OutOfSight
        module = next(iter(names)).rpartition(".")[0]
        if not module or self._module_defines(path, module, node.attr.value) != defined:
            raise _OutOfSight  # an attribute of anything else: its object may be ours
        read(path, node)

    def _stray(self, path: str, ctx, node: cst.Name, ancestors, defined: str, read) -> None:
        """A name spelt like the definition, not read through an import of it: another binding, or a star import's."""
        parent = ancestors[-1] if ancestors else None
        if any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in ancestors):
            return  # an import of the same name from elsewhere
        if isinstance(parent, (cst.Attribute, cst.Arg, cst.Param, cst.FunctionDef, cst.ClassDef)) and node is not getattr(parent, "value", None):
            return  # `x.name`, `f(name=...)`, a parameter or a definition's own name: not a read of ours
        scope = ctx.scope(node)
        if scope is None:
            raise _OutOfSight
        access = next((a for a in scope.accesses[node.value] if a.node is node), None) if node.value in scope.accesses else None
        if access is None or access.referents:
            return  # assigned here, or a binding of this module
        if self._star_source(path, ctx, node.value) == defined:
            read(path, node)
            return
        raise _OutOfSight

    def _star_source(self, path: str, ctx, name: str) -> str | None:
        for imported in _module_level_from_imports(ctx.module):
            if isinstance(imported.names, cst.ImportStar):
                source = self._defined_in(path, imported, name)
                if source is not None:
                    return source
        return None

    def _defined_in(self, path: str, imported: cst.ImportFrom, name: str, depth: int = 0) -> str | None:
        """The program file that defines `name` as `imported` (in `path`) finds it, following re-exports."""
        module = "." * len(imported.relative) + (dotted(imported.module) if imported.module is not None else "")
        return self._module_defines(path, module, name, depth)

    def _module_defines(self, path: str, module: str, name: str, depth: int = 0) -> str | None:
        """The program file that defines `name` of `module` as `path` imports it, following re-exports."""
        candidates = self.calls.module_paths(path, module)
        if len(candidates) != 1:
            if candidates:
                raise _OutOfSight  # two modules it may be
            return None  # not a module of the program
        (found,) = candidates
        ctx = self.calls.context(found)
        if ctx is None:
            raise _OutOfSight
        scope = ctx.scope(ctx.module)
        own = [a for a in assignments_of(scope, name) if not isinstance(a.node, (cst.Import, cst.ImportFrom))] if scope else []
        if own:
            return found
        if depth >= _STAR_DEPTH:
            raise _OutOfSight
        for imported in _module_level_from_imports(ctx.module):
            if isinstance(imported.names, cst.ImportStar) or any(dotted(a.name) == name and a.asname is None for a in imported.names):
                source = self._defined_in(found, imported, name, depth + 1)
                if source is not None:
                    return source
        return None

    def _parents_of(self, path: str) -> dict[int, cst.CSTNode]:
        if path not in self._parents:
            self._parents[path] = {id(node): ancestors[-1] for node, ancestors in walk(self.calls.context(path).module) if ancestors}
        return self._parents[path]


def _module_level_from_imports(module: cst.Module):
    """The `from ... import ...` statements of the module's own body (how a module re-exports names)."""
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.ImportFrom):
                yield small


def _literal_index(subscript: cst.Subscript) -> int | None:
    """`n` of `value[n]`, a plain non-negative integer index."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return None
    index = subscript.slice[0].slice.value
    return int(index.value) if isinstance(index, cst.Integer) and index.value.isdigit() else None


def _of_self(node) -> bool:
    """`self.name`."""
    return isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"


def _starred(node) -> bool:
    return any(isinstance(element, cst.StarredElement) for element in node.elements)
