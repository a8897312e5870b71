"""The functions the rewrite inserts into files, kept here as real modules so that they
are linted, tested and imported like any code; the rewrite reads them as resources, one
file per helper named after it, and moves their imports into the file's own (once,
under free names)."""

from dataclasses import dataclass
from functools import cache
from importlib import resources

import libcst as cst

from migrate_fsdp.rewrite.syntax import dotted, is_docstring, is_import_line


HELPERS = __name__  # a helper importing another helper gets it inserted too


@dataclass(frozen=True)
class HelperSource:
    # (module, name): `from module import name`, name None: `import module`
    imports: tuple[tuple[str, str | None], ...]
    definitions: tuple[cst.BaseStatement, ...]


@cache
def helper_source(name: str) -> HelperSource:
    module = cst.parse_module(
        resources.files(__package__).joinpath(f"{name}.py").read_text(encoding="utf-8")
    )
    imports, definitions = [], []
    for index, statement in enumerate(module.body):
        if index == 0 and is_docstring(statement):
            continue
        if is_import_line(statement):
            for imp in statement.body:
                if isinstance(imp, cst.ImportFrom):
                    imports.extend(
                        (dotted(imp.module), dotted(alias.name)) for alias in imp.names
                    )
                else:
                    imports.extend((dotted(alias.name), None) for alias in imp.names)
            continue
        definitions.append(statement)
    definitions[0] = definitions[0].with_changes(leading_lines=[])
    return HelperSource(tuple(imports), tuple(definitions))


@cache
def helper_names() -> frozenset[str]:
    """The name of every helper: a module-level function of that name in a rewritten
    file is one the rewrite inserted, which no rule reads again and through which no
    model goes anywhere."""
    files = resources.files(__package__).iterdir()
    return frozenset(
        path.name[:-3]
        for path in files
        if path.name.endswith(".py") and path.name != "__init__.py"
    )


def is_inserted_helper(node, parent) -> bool:
    """`node` is a module-level definition of a helper (`parent`: its parent)."""
    return (
        isinstance(node, cst.FunctionDef)
        and isinstance(parent, cst.Module)
        and node.name.value in helper_names()
    )


@cache
def helper_lines() -> frozenset[str]:
    """Every helper's lines, stripped: inserted as they are in their linted files,
    never laid out again."""
    files = (
        path
        for path in resources.files(__package__).iterdir()
        if path.name.endswith(".py")
    )
    return frozenset(
        line.strip()
        for path in files
        for line in path.read_text(encoding="utf-8").splitlines()
    )


class _Rename(cst.CSTTransformer):
    """Names bound by the helper's imports, renamed to what the file imports them as."""

    def __init__(self, renames: dict[str, str]) -> None:
        super().__init__()
        self.renames = renames

    def leave_Attribute(self, original, updated):
        # `x.name`: only `x` is a use of a name
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original, updated):
        return updated.with_changes(keyword=original.keyword)  # `f(name=...)` neither

    def leave_Name(self, original, updated):
        return updated.with_changes(
            value=self.renames.get(updated.value, updated.value)
        )


def renamed(definitions, renames: dict[str, str]) -> list[cst.BaseStatement]:
    if not renames:
        return list(definitions)
    return [statement.visit(_Rename(renames)) for statement in definitions]
