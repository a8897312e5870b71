"""Import and helper bookkeeping, done once per file after the rules ran.

FSDP1 imports are dropped only when nothing in the rewritten file still uses
the name they bind (an unconverted use keeps its import, next to its TODO);
FSDP2 names the rules asked for are added once, merged into an existing
`from M import ...` when there is one, else where the FSDP imports stood.
"""

import libcst as cst

from migrate_fsdp.rewrite.names import FSDP_PACKAGE, is_fsdp1
from migrate_fsdp.rewrite.syntax import dotted, imported_modules, is_docstring, is_import_line


class _UsedNames(cst.CSTVisitor):
    """Names and dotted chains the code uses outside imports, and what `__all__` re-exports."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.chains: set[str] = set()

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.chains.add(dotted(node))

    def visit_Assign(self, node: cst.Assign) -> None:
        if any(dotted(target.target) == "__all__" for target in node.targets):
            for string in _strings_in(node.value):
                self.names.add(string)


def _strings_in(node) -> list[str]:
    if isinstance(node, (cst.List, cst.Tuple)):
        return [
            e.value.evaluated_value
            for e in node.elements
            if isinstance(e.value, cst.SimpleString) and isinstance(e.value.evaluated_value, str)
        ]
    return []


def _is_fsdp_module(module_name: str) -> bool:
    return module_name == FSDP_PACKAGE or module_name.startswith(FSDP_PACKAGE + ".")


def _without_trailing_comma(aliases: list, original: list) -> list:
    kept = list(aliases)
    kept[-1] = kept[-1].with_changes(comma=original[-1].comma)
    return kept


class _DropUnusedFSDP1Imports(cst.CSTTransformer):
    def __init__(self, used: _UsedNames) -> None:
        super().__init__()
        self.used = used

    def leave_ImportFrom(self, original, updated):
        if updated.relative or isinstance(updated.names, cst.ImportStar):
            return updated
        module_name = dotted(updated.module)
        if not _is_fsdp_module(module_name):
            return updated
        kept = [alias for alias in updated.names if not self._unused_fsdp1(f"{module_name}.{dotted(alias.name)}", alias)]
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        return updated.with_changes(names=_without_trailing_comma(kept, updated.names))

    def leave_Import(self, original, updated):
        kept = [alias for alias in updated.names if not self._unused_fsdp1(dotted(alias.name), alias)]
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        return updated.with_changes(names=_without_trailing_comma(kept, updated.names))

    def _unused_fsdp1(self, qualified: str, alias: cst.ImportAlias) -> bool:
        if not is_fsdp1(qualified):
            return False
        if alias.asname is not None:
            return dotted(alias.asname.name) not in self.used.names
        bound = dotted(alias.name)
        if "." not in bound:  # `from m import X`
            return bound not in self.used.names
        # `import torch.distributed.fsdp.wrap`: used while a chain spells it out.
        return not any(chain == bound or chain.startswith(bound + ".") for chain in self.used.chains)

    def leave_SimpleStatementLine(self, original, updated):
        if not updated.body:
            return cst.RemoveFromParent()
        return updated

    def leave_IndentedBlock(self, original, updated):
        if not updated.body:
            return updated.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return updated


def _already_imported(body, module_name: str, name: str, local: str) -> bool:
    for statement in body:
        if not is_import_line(statement):
            continue
        for imp in statement.body:
            if isinstance(imp, cst.ImportFrom) and not imp.relative and dotted(imp.module) == module_name:
                if isinstance(imp.names, cst.ImportStar):
                    continue
                for alias in imp.names:
                    bound = dotted(alias.asname.name) if alias.asname else dotted(alias.name)
                    if dotted(alias.name) == name and bound == local:
                        return True
    return False


def _alias(name: str, local: str) -> cst.ImportAlias:
    asname = None if name == local else cst.AsName(name=cst.Name(local))
    return cst.ImportAlias(name=cst.Name(name), asname=asname)


def _merge_into(statement, module_name: str, aliases: list):
    """`statement` with `aliases` appended to its `from module_name import ...`, or None."""
    for index, imp in enumerate(statement.body):
        if (
            isinstance(imp, cst.ImportFrom)
            and not imp.relative
            and not isinstance(imp.names, cst.ImportStar)
            and dotted(imp.module) == module_name
        ):
            names = list(imp.names)
            if imp.rpar is not None and names[-1].comma != cst.MaybeSentinel.DEFAULT:
                # Parenthesised with a trailing comma, often one name a line: a comma's
                # whitespace holds the next line's indent, the last one the closing line's.
                between = names[-2].comma if len(names) > 1 else cst.Comma(whitespace_after=imp.lpar.whitespace_after)
                closing = names[-1].comma
                names[-1] = names[-1].with_changes(comma=between)
                new = [alias.with_changes(comma=between) for alias in aliases]
                new[-1] = new[-1].with_changes(comma=closing)
            else:
                comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                names[-1] = names[-1].with_changes(comma=comma)
                new = [alias.with_changes(comma=comma) for alias in aliases]
                new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            body = list(statement.body)
            body[index] = imp.with_changes(names=[*names, *new])
            return statement.with_changes(body=body)
    return None


def _import_position(body: list) -> int:
    """Where a new FSDP2 import line goes: before the first FSDP import, else after the header's imports."""
    last_import = None
    for index, statement in enumerate(body):
        if is_import_line(statement):
            if any(_is_fsdp_module(m) for m in imported_modules(statement)):
                return index
            last_import = index
        elif not is_docstring(statement) and last_import is not None:
            break
    if last_import is not None:
        return last_import + 1
    return 1 if body and is_docstring(body[0]) else 0


def _add_imports(body: list, imports: dict) -> None:
    by_module: dict[str, list] = {}
    for (module_name, name), local in imports.items():
        if not _already_imported(body, module_name, name, local):
            by_module.setdefault(module_name, []).append(_alias(name, local))
    for module_name, aliases in by_module.items():
        for index, statement in enumerate(body):
            merged = _merge_into(statement, module_name, aliases) if is_import_line(statement) else None
            if merged is not None:
                body[index] = merged
                break
        else:
            position = _import_position(body)
            line = cst.SimpleStatementLine([cst.ImportFrom(module=cst.parse_expression(module_name), names=aliases)])
            if position < len(body) and is_import_line(body[position]):
                # Take over the comments above the line we are inserted before.
                line = line.with_changes(leading_lines=body[position].leading_lines)
                body[position] = body[position].with_changes(leading_lines=[])
            body.insert(position, line)


def _add_helpers(body: list, helpers: dict) -> None:
    position = next(
        (i for i, statement in enumerate(body) if not (is_import_line(statement) or is_docstring(statement))),
        len(body),
    )
    definitions = []
    for statements in helpers.values():
        first, *rest = statements
        definitions.append(first.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *first.leading_lines]))
        definitions.extend(rest)
    if position < len(body):
        following = body[position]
        blank = 0
        for line in following.leading_lines:
            if line.comment is not None:
                break
            blank += 1
        missing = [cst.EmptyLine()] * max(0, 2 - blank)
        body[position] = following.with_changes(leading_lines=[*missing, *following.leading_lines])
    body[position:position] = definitions


def finish_module(module: cst.Module, imports: dict, helpers: dict) -> cst.Module:
    """Add the requested imports and helpers, then drop FSDP1 imports nobody uses any more."""
    used = _UsedNames()
    module.visit(used)
    body = list(module.body)
    _add_imports(body, imports)
    if helpers:
        _add_helpers(body, helpers)
    module = module.with_changes(body=body)
    return module.visit(_DropUnusedFSDP1Imports(used))
