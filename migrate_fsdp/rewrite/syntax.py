"""Small readers and builders of LibCST nodes that rules and the engine share."""

import inspect
import re

import libcst as cst


def dotted(node) -> str:
    """`a.b.c` for a Name/Attribute chain, "" for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr.value}" if inner else ""
    return ""


def walk(*roots):
    """Every node under `roots` (pre-order) with its ancestors, outermost first."""
    stack = [(root, ()) for root in reversed(roots)]
    while stack:
        node, parents = stack.pop()
        yield node, parents
        for child in reversed(children(node)):
            stack.append((child, (*parents, node)))


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node.children`, read off its fields: LibCST's own rebuilds the node through a visitor to list them,
    which made a quarter of the rewrite's time. The fields, in the order the code spells them, are the ones
    its class's `_visit_and_replace_children` visits, read once per class."""
    fields = _CHILD_FIELDS.get(type(node))
    if fields is None:
        fields = _CHILD_FIELDS[type(node)] = _child_fields(type(node))
    if fields == _UNREADABLE:
        return list(node.children)
    found = []
    for name in fields:
        value = getattr(node, name)
        if isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, cst.CSTNode))
        elif isinstance(value, cst.CSTNode):
            found.append(value)
    return found


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_UNREADABLE = ("",)  # LibCST installed without its sources: its own, slower listing


def _child_fields(cls: type) -> tuple[str, ...]:
    method = next(klass.__dict__["_visit_and_replace_children"] for klass in cls.__mro__ if "_visit_and_replace_children" in klass.__dict__)
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):
        return _UNREADABLE
    return tuple(dict.fromkeys(re.findall(r'visit_\w+\(\s*self,\s*"(\w+)"', source)))


def chain_root(node) -> str:
    """The leftmost name of an attribute chain (`a` for `a.b.c`), "" if there is none."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def is_docstring(statement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def is_import_line(statement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body
    )


def import_aliases(module: cst.Module):
    """(qualified name as written, alias) of every absolute `import` / `from ... import` in `module`, at any depth."""
    for node, _ in walk(module):
        if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    yield f"{dotted(node.module)}.{dotted(alias.name)}", alias
        elif isinstance(node, cst.Import):
            for alias in node.names:
                yield dotted(alias.name), alias


def imported_modules(statement) -> list[str]:
    """Absolute module paths an import line names (`from m import x` -> m; `import a.b` -> a.b)."""
    modules = []
    if isinstance(statement, cst.SimpleStatementLine):
        for imp in statement.body:
            if isinstance(imp, cst.ImportFrom) and not imp.relative and imp.module is not None:
                modules.append(dotted(imp.module))
            elif isinstance(imp, cst.Import):
                modules.extend(dotted(alias.name) for alias in imp.names)
    return modules



def subtree_ids(node: cst.CSTNode) -> set[int]:
    """The ids of `node` and of every node under it."""
    ids = set()

    class _Collect(cst.CSTVisitor):
        def on_visit(self, child) -> bool:
            ids.add(id(child))
            return True

    node.visit(_Collect())
    return ids
