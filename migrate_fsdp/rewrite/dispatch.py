"""Runs every selected rule in one traversal, and catches what they all missed.

Two walks of the same tree with the same metadata: a read-only one for the
rules' `collect_*` hooks, then the rewriting one. During the rewriting walk
the dispatcher also notes every reference to an FSDP1 name; when the smallest
statement holding one is left and no rule converted or reported it, the
reference gets the catch-all diagnostic, so nothing FSDP1 stays behind
silently.
"""

from collections import defaultdict

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS
from migrate_fsdp.rewrite.analysis.program import DUAL_VERSION
from migrate_fsdp.rewrite.context import _STATEMENT_TYPES, FileContext
from migrate_fsdp.rewrite.diagnostics import is_todo
from migrate_fsdp.rewrite.forward_refs import in_annotation, spelled_fsdp1_names
from migrate_fsdp.rewrite.helpers import is_inserted_helper
from migrate_fsdp.rewrite.syntax import chain_root, dotted

LEFTOVER_CODE = "MF900"


def _hooks(rules, prefix: str) -> dict[str, list]:
    table = defaultdict(list)
    for rule in rules:
        for attr in dir(type(rule)):
            if attr.startswith(prefix):
                table[attr[len(prefix) :]].append(getattr(rule, attr))
    return dict(table)


class _Collector(cst.CSTVisitor):
    """The read-only walk: rules' `collect_*` hooks, and the names imports from torch bind."""

    def __init__(self, ctx: FileContext, hooks: dict, torch_names: set) -> None:
        self.ctx = ctx
        self.hooks = hooks
        self.torch_names = torch_names

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.ctx.stack.append(node)
        if is_inserted_helper(node, self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None):
            return False  # a helper a previous rewrite inserted: nothing in it is the user's
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self._note_torch_import(node)
        for hook in self.hooks.get(type(node).__name__, ()):
            hook(node)
        return True

    def _note_torch_import(self, node) -> None:
        if isinstance(node, cst.ImportFrom):
            if node.relative or not dotted(node.module).startswith("torch"):
                return
            if isinstance(node.names, cst.ImportStar):
                return
        for alias in node.names:
            if isinstance(node, cst.Import) and not dotted(alias.name).startswith("torch"):
                continue
            bound = alias.asname.name if alias.asname else alias.name
            self.torch_names.add(chain_root(bound) if isinstance(bound, (cst.Name, cst.Attribute)) else "")

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.ctx.stack.pop()


class Dispatcher(cst.CSTTransformer):
    def __init__(self, ctx: FileContext, rules: list, catch_leftovers: bool) -> None:
        super().__init__()
        self.ctx = ctx
        ctx.use_codes = frozenset(rule.code for rule in rules if rule.reports_model_uses)
        ctx.capabilities = frozenset().union(*(rule.provides for rule in rules))
        self._collect = _hooks(rules, "collect_")
        self._visit = _hooks(rules, "visit_")
        self._leave = _hooks(rules, "leave_")
        self._catch_leftovers = catch_leftovers
        self._import_depth = 0
        self._open_references: dict[int, list] = defaultdict(list)  # statement id -> [(node, ancestor ids)]
        self._reference_ids: set[int] = set()
        self._torch_names: set[str] = set()  # local names that imports from torch bind
        self._dual_regions: set[int] = set()
        self.changed = False  # LibCST rebuilds every node, so identity cannot tell

    def run(self) -> cst.Module:
        self.ctx.module.visit(_Collector(self.ctx, self._collect, self._torch_names))
        return self.ctx.module.visit(self)

    def on_visit(self, node: cst.CSTNode) -> bool:
        ctx = self.ctx
        ctx.stack.append(node)
        if is_inserted_helper(node, ctx.stack[-2] if len(ctx.stack) >= 2 else None):
            self._dual_regions.add(id(node))  # left whole, like code that serves both versions
            return False
        dual = ctx.dual_versions.why(node) if isinstance(node, _STATEMENT_TYPES) else None
        if dual is not None:
            # Code that serves both versions is left whole: no rule looks inside.
            ctx.report(node, DUAL_VERSION, f"already serves FSDP1 and FSDP2 ({dual}); left as is")
            self._dual_regions.add(id(node))
            return False
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self._import_depth += 1
        elif self._catch_leftovers and not self._import_depth and isinstance(node, (cst.Name, cst.Attribute)):
            self._note_reference(node)
        elif self._catch_leftovers and isinstance(node, cst.SimpleString):
            self._note_spelled_reference(node)
        for hook in self._visit.get(type(node).__name__, ()):
            hook(node)
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node):
        if id(original_node) in self._dual_regions:
            self.ctx.stack.pop()
            return self._apply_statement_edits(original_node, updated_node)
        result = updated_node
        for hook in self._leave.get(type(original_node).__name__, ()):
            result = hook(original_node, result)
            if type(result) is not type(original_node):
                break
        if isinstance(original_node, (cst.Import, cst.ImportFrom)):
            self._import_depth -= 1
        elif isinstance(original_node, _STATEMENT_TYPES):
            self._flag_leftovers(original_node)
            result = self._apply_statement_edits(original_node, result)
        if result is not updated_node:
            self.changed = True
        self.ctx.stack.pop()
        return result

    def _note_reference(self, node) -> None:
        # Qualified names are computed lazily and cost; only chains rooted in a
        # name imported from torch can resolve into torch.distributed.fsdp.
        if chain_root(node) not in self._torch_names or not self.ctx.fsdp1_names(node):
            return
        ancestor_ids = [id(n) for n in self.ctx.stack]
        if self._reference_ids.isdisjoint(ancestor_ids[:-1]):  # only the outermost of a chain
            self._reference_ids.add(id(node))
            self._open_references[id(self.ctx.statement())].append((node, ancestor_ids))

    def _note_spelled_reference(self, node: cst.SimpleString) -> None:
        # A string annotation spelling an FSDP1 class; the cheap text test first.
        if any(name in node.value for name in self._torch_names) and in_annotation(self.ctx.stack):
            if spelled_fsdp1_names(self.ctx, node):
                self._open_references[id(self.ctx.statement())].append((node, [id(n) for n in self.ctx.stack]))

    def _flag_leftovers(self, statement) -> None:
        for node, ancestor_ids in self._open_references.pop(id(statement), ()):
            if not self.ctx.is_covered(ancestor_ids):
                spelled = isinstance(node, cst.SimpleString)
                name = sorted(spelled_fsdp1_names(self.ctx, node) if spelled else self.ctx.fsdp1_names(node))[0]
                if name == FSDP_CLASS and not spelled:
                    # The class itself, used in a way no rule reads (`FSDP1Module: TypeAlias = FSDP`, then
                    # `FSDP1Module(module, ...)`): the program may build FSDP1 models through it, which stay.
                    self.ctx.program.constructor(node, converts=False, stack=tuple(self.ctx.stack))
                self.ctx.report(
                    node,
                    LEFTOVER_CODE,
                    f"`{self.ctx.code(node)}` ({name}) is FSDP1 API with no automatic FSDP2 rewrite here; "
                    "see docs/mapping.md for its FSDP2 replacement",
                )

    def _apply_statement_edits(self, original, updated):
        edits = self.ctx.pop_edits(original)
        if edits is None:
            return updated
        todo = self.ctx.todo_line(original, edits.todos) if edits.todos else None
        if isinstance(updated, cst.FlattenSentinel) and updated.nodes and isinstance(updated.nodes[0], _STATEMENT_TYPES):
            # A statement replaced by its body (a `with` block that goes): a heads-up on it goes above the body.
            nodes = list(updated.nodes)
            return cst.FlattenSentinel([_with_todo(nodes[0], todo), *nodes[1:]]) if todo is not None else updated
        if not isinstance(updated, _STATEMENT_TYPES):
            return updated
        if todo is not None:
            updated = _with_todo(updated, todo)
        if not (edits.before or edits.after):
            return updated
        group = [*edits.before, updated, *edits.after]
        if edits.before:
            # Comments above the statement stay above the whole group; the TODO stays on it.
            own = [line for line in updated.leading_lines if line.comment and line.comment.value == todo]
            above = [line for line in updated.leading_lines if line not in own]
            group[0] = group[0].with_changes(leading_lines=[*above, *group[0].leading_lines])
            group[len(edits.before)] = updated.with_changes(leading_lines=own)
        return cst.FlattenSentinel(self._spaced(group, original))

    def _spaced(self, group: list, original) -> list:
        """`group` with the blank lines black puts around a function the rewrite inserted: two at module level,
        one in a block, none where the block begins."""
        parent = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        wanted = 2 if isinstance(parent, cst.Module) else 1
        first = isinstance(parent, (cst.Module, cst.IndentedBlock)) and parent.body and parent.body[0] is original
        spaced = []
        for index, statement in enumerate(group):
            defined = isinstance(statement, (cst.FunctionDef, cst.ClassDef))
            after_definition = index > 0 and isinstance(group[index - 1], (cst.FunctionDef, cst.ClassDef))
            if (defined or after_definition) and not (index == 0 and first):
                lines = list(statement.leading_lines)
                blank = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
                statement = statement.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * max(0, wanted - blank) + lines)
            spaced.append(statement)
        return spaced


def _with_todo(statement, todo: str):
    """`statement` with the TODO line `todo` last above it: one a statement, so a re-run's (or an older run's)
    line is replaced, not repeated."""
    kept = [line for line in statement.leading_lines if not (line.comment and is_todo(line.comment.value))]
    return statement.with_changes(leading_lines=[*kept, cst.EmptyLine(comment=cst.Comment(todo))])
