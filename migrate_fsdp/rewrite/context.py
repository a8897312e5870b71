"""Per-file state shared by the rules of one rewrite pass.

Rules never touch imports, TODO comments or statement lists directly: they ask
the context, and the engine applies the requests once, in one place, so that
two rules asking for the same import or the same helper get one, and a re-run
adds nothing.
"""

from dataclasses import dataclass, field

import libcst as cst
from libcst._metadata_dependent import LazyValue
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, Scope, ScopeProvider

from migrate_fsdp.rewrite.analysis.program import Gate
from migrate_fsdp.rewrite.analysis.versions import DualVersionRegions
from migrate_fsdp.rewrite.diagnostics import Diagnostic, todo_comment
from migrate_fsdp.rewrite.helpers import HELPERS, helper_source, renamed
from migrate_fsdp.rewrite.names import canonical, is_fsdp1

# Nodes that own `leading_lines`, where a TODO comment can sit.
_STATEMENT_TYPES = (
    cst.SimpleStatementLine,
    cst.BaseCompoundStatement,
    cst.Else,
    cst.Finally,
    cst.ExceptHandler,
    cst.ExceptStarHandler,
)
_BODY_TYPES = (cst.Module, cst.IndentedBlock)
# Expressions whose parts run later, repeatedly or conditionally: code hoisted
# out of them into statements would run at another time, or always.
_DEFERRED_TYPES = (
    cst.Lambda,
    cst.ListComp,
    cst.SetComp,
    cst.DictComp,
    cst.GeneratorExp,
    cst.IfExp,
    cst.BooleanOperation,
)


@dataclass
class _StatementEdits:
    before: list = field(default_factory=list)
    after: list = field(default_factory=list)
    todos: list = field(default_factory=list)  # the codes reported on the statement


class FileContext:
    def __init__(self, path: str, wrapper: MetadataWrapper, selected: frozenset, todo: bool, text: str = "") -> None:
        self.path = path
        self.module = wrapper.module
        self.text = text  # the source, for cheap text tests before any walk
        self.facts: dict = {}  # analysis results rules share, keyed by rule name
        self.stack: list[cst.CSTNode] = []  # original nodes from the module down to the current one
        self._wrapper = wrapper
        self._qualified = wrapper.resolve(QualifiedNameProvider)
        self._scopes = wrapper.resolve(ScopeProvider)
        self._selected = selected
        self._todo = todo
        self._reports: list[tuple[cst.CSTNode, str, str]] = []
        self._covered: set[int] = set()
        self._edits: dict[int, _StatementEdits] = {}
        self.imports: dict[tuple[str, str], str] = {}  # (module, name) -> local name to add
        self.helpers: dict[str, list[cst.BaseStatement]] = {}
        self._positions = None
        self.dual_versions = DualVersionRegions(self)
        self.program = Gate(self, None)
        self.use_codes: frozenset = frozenset()  # codes whose reports are uses of models left FSDP1
        self.capabilities: frozenset = frozenset()  # what the selected rules provide (rule.py)

    def with_verdict(self, verdict) -> "FileContext":
        """A fresh context over the same parsed tree and metadata, for a rewrite under the program's verdict."""
        ctx = FileContext(self.path, self._wrapper, self._selected, self._todo, self.text)
        ctx._positions = self._positions
        ctx.program = Gate(ctx, verdict)
        return ctx

    # ----- reading the original tree -------------------------------------------------

    def qualified_names(self, node: cst.CSTNode) -> set[str]:
        names = self._qualified.get(node)
        if names is None:
            return set()
        if isinstance(names, LazyValue):
            names = names()
        return {canonical(q.name) for q in names}

    def fsdp1_names(self, node: cst.CSTNode) -> set[str]:
        return {name for name in self.qualified_names(node) if is_fsdp1(name)}

    def matches(self, node: cst.CSTNode, *names: str) -> bool:
        return not self.qualified_names(node).isdisjoint(names)

    def scope(self, node: cst.CSTNode) -> Scope | None:
        scope = self._scopes.get(node)
        return scope() if isinstance(scope, LazyValue) else scope

    def position(self, node: cst.CSTNode) -> tuple[int, int]:
        """(line, column), 1-based, where the original `node` starts."""
        if self._positions is None:
            self._positions = self._wrapper.resolve(PositionProvider)
        start = self._positions[node].start
        return start.line, start.column + 1

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def selected(self, code: str) -> bool:
        return code in self._selected

    # ----- where we are --------------------------------------------------------------

    def statement(self) -> cst.CSTNode:
        """The innermost statement (or clause) around the node being visited."""
        for node in reversed(self.stack):
            if isinstance(node, _STATEMENT_TYPES):
                return node
        raise LookupError("not inside a statement")

    def can_insert_statements(self) -> bool:
        """True when statements can go right before/after the current statement.

        That is the case for a statement that sits in a block (and for the
        iterable of a `for` that does); not for a
        clause (`else:`) or a one-line suite (`if x: y = f()`), where the
        innermost statement is the compound one, nor inside a lambda, a
        comprehension (but its first iterable) or a conditional expression: code
        inserted beside the statement would run under different conditions.
        """
        for index in range(len(self.stack) - 1, 0, -1):
            node = self.stack[index]
            if isinstance(node, cst.SimpleStatementLine):
                return isinstance(self.stack[index - 1], _BODY_TYPES)
            if isinstance(node, cst.For) and index + 1 < len(self.stack) and self.stack[index + 1] is node.iter:
                return isinstance(self.stack[index - 1], _BODY_TYPES)  # a loop's iterable: evaluated once, before it
            if _first_iterable(node, self.stack[index + 1 : index + 3]):
                continue  # `[p for p in model.parameters()]`: evaluated once, where the comprehension is
            if isinstance(node, (*_STATEMENT_TYPES, *_DEFERRED_TYPES)):
                return False
        return False

    # ----- requests --------------------------------------------------------------------

    def report(
        self, node: cst.CSTNode, code: str, message: str, unsure: bool = False, fsdp1_only: bool = False, any_model: bool = False
    ) -> None:
        """Leave `node` as it is and tell the user why, with a TODO in the file.

        `unsure`: `node` is shaped like a use of an FSDP1 model whose model cannot be traced at all;
        `fsdp1_only`: it reads what only an FSDP1 model has (`m._fsdp_wrapped_module`), whatever `m` is traced to;
        `any_model`: it reads parameters of models no one can name (an optimizer's groups): any model may reach it.
        """
        self._reports.append((node, code, message))
        self._covered.add(id(node))
        if code in self.use_codes:
            self.program.stays(node, code, tuple(self.stack), unsure, fsdp1_only, any_model)
        if self._todo and not self._announced_above(code):
            edits = self._edits_for(self.statement())
            if code not in edits.todos:
                edits.todos.append(code)

    def mark_handled(self, node: cst.CSTNode) -> None:
        """Record that FSDP1 references inside `node` are dealt with: rewritten away, or left for a report elsewhere."""
        self._covered.add(id(node))

    def insert_before(self, statements: list[cst.BaseStatement]) -> None:
        self._insert(statements, before=True)

    def insert_after(self, statements: list[cst.BaseStatement]) -> None:
        self._insert(statements, before=False)

    def _insert(self, statements, before: bool) -> None:
        if not self.can_insert_statements():
            raise ValueError("statements cannot be inserted here; check can_insert_statements() first")
        edits = self._edits_for(self.statement())
        (edits.before if before else edits.after).extend(statements)

    def require_import(self, module: str, name: str | None) -> str:
        """Make `name` from `module` (with name None, `module` itself) available at module level;
        returns the local name."""
        key = (module, name)
        if key not in self.imports:
            self.imports[key] = self._free_local_name(module, name)
        return self.imports[key]

    def add_helper(self, name: str) -> str:
        """Add the helper function `name` (migrate_fsdp/rewrite/helpers/<name>.py), its imports and the
        helpers it imports, once, unless the file already has a definition of that name."""
        if name not in self.helpers and not self._defines_top_level(name):
            source = helper_source(name)
            renames = {}
            for module, imported in source.imports:
                if module.startswith(f"{HELPERS}."):
                    self.add_helper(imported)
                    continue
                local = self.require_import(module, imported)
                if local != (imported or module):
                    renames[imported or module] = local
            self.helpers[name] = renamed(source.definitions, renames)
        return name

    # ----- engine side -------------------------------------------------------------------

    def is_covered(self, ancestor_ids) -> bool:
        return not self._covered.isdisjoint(ancestor_ids)

    def pop_edits(self, statement: cst.CSTNode) -> _StatementEdits | None:
        return self._edits.pop(id(statement), None)

    def todo_line(self, statement: cst.CSTNode, codes: list[str]) -> str:
        """The TODO comment for `codes` above the original `statement`, fitted to its indentation."""
        indent = self._wrapper.resolve(PositionProvider)[statement].start.column
        return todo_comment(codes, indent)

    def diagnostics(self) -> list[Diagnostic]:
        return sorted({Diagnostic(self.path, *self.position(node), code, message) for node, code, message in self._reports})

    def _announced_above(self, code: str) -> bool:
        """Whether a statement around the current one (a `def`, `if` or `with` header) has a TODO for
        `code` already: one line above the block points at it, the report lists every site."""
        statement = self.statement()
        return any(
            code in self._edits[id(node)].todos
            for node in self.stack
            if node is not statement and isinstance(node, _STATEMENT_TYPES) and id(node) in self._edits
        )

    def _edits_for(self, statement: cst.CSTNode) -> _StatementEdits:
        return self._edits.setdefault(id(statement), _StatementEdits())

    def _global_scope(self) -> Scope | None:
        return self.scope(self.module)

    def _free_local_name(self, module: str, name: str | None) -> str:
        qualified = module if name is None else f"{module}.{name}"
        name = name or module
        scope = self._global_scope()
        if scope is None or name not in scope:
            return name
        bound = {q.name for q in scope.get_qualified_names_for(name)}
        if qualified in bound or (name == module and any(q.startswith(module + ".") for q in bound)):
            return name  # imported already (`import torch.nn` binds `torch` too)
        alias = f"fsdp2_{name}"
        if alias in scope:
            raise ValueError(f"cannot import {module}.{name}: both {name} and {alias} are taken")
        return alias

    def _defines_top_level(self, name: str) -> bool:
        for statement in self.module.body:
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)) and statement.name.value == name:
                return True
        return False


def _first_iterable(node, below) -> bool:
    """`below` (the next nodes down the stack) leads from comprehension `node` into its outermost iterable."""
    if not isinstance(node, (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)) or len(below) < 2:
        return False
    return below[0] is node.for_in and below[1] is node.for_in.iter
