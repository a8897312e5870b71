"""Small readers and builders of LibCST nodes that rules and the engine share."""

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
        for child in reversed(list(node.children)):
            stack.append((child, (*parents, node)))


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
