"""Import and helper bookkeeping, done once per file after the rules ran.

The aim is an output with no pyflakes finding its input did not have. An
import is dropped when nothing in the rewritten file uses the name it binds
any more and the input used it (the rewrite took its last use away:
`functools` of a removed `functools.partial(...)` policy), or it is FSDP1's
and the file keeps no FSDP1 at all or got FSDP2 code (a file that only gets
TODO comments keeps the imports it did not use, as they were); an
unconverted use keeps its import, next to its TODO. Names in string
annotations count as uses. FSDP2 names the rules asked for are added once and
only when the output uses them, merged into an existing `from M import ...`
when there is one, else where the FSDP imports stood, inside the same
`try:` / version check when those were guarded.
"""

import sys

import libcst as cst

from migrate_fsdp.rewrite.names import FSDP_PACKAGE, is_fsdp1
from migrate_fsdp.rewrite.rules.construction.codegen import conjunction, negated
from migrate_fsdp.rewrite.syntax import chain_root, dotted, import_aliases, imported_modules, is_docstring, is_import_line


class _UsedNames(cst.CSTVisitor):
    """Names and dotted chains the code uses outside imports, and what `__all__` re-exports.

    `scoped`: only the uses a module-level import serves; a function that imports
    a name itself (anywhere in its body) holds it as a local throughout, and so do
    the functions nested in it.
    """

    def __init__(self, scoped: bool = True) -> None:
        self.names: set[str] = set()
        self.chains: set[str] = set()
        self._scoped = scoped
        self._local: list[set[str]] = []  # names the enclosing functions import themselves

    def visit_Import(self, node) -> bool:
        return False

    def visit_ImportFrom(self, node) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if not self._scoped:
            return True
        # Decorators, defaults and annotations run where the function is defined: the names it imports
        # itself do not serve them (`def config(self) -> "MixedPrecision":` then a local import).
        for part in (*node.decorators, node.params, node.returns):
            if part is not None:
                part.visit(self)
        self._local.append(local_imports(node))
        node.body.visit(self)
        self._local.pop()
        return False

    def _shadowed(self, name: str) -> bool:
        return any(name in names for names in self._local)

    def visit_Name(self, node: cst.Name) -> None:
        if not self._shadowed(node.value):
            self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if not self._shadowed(chain_root(node)):
            self.chains.add(dotted(node))
        node.value.visit(self)
        return False  # `DistributedType.FSDP` does not use a name `FSDP`

    def visit_Assign(self, node: cst.Assign) -> None:
        if any(dotted(target.target) == "__all__" for target in node.targets):
            for string in _strings_in(node.value):
                self.names.add(string)

    def visit_Annotation(self, node: cst.Annotation) -> None:
        node.visit(_StringAnnotations(self))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        # `FSDP = None` in an `except ImportError:` rebinds the name, it does not use it
        return not isinstance(node.target, cst.Name)


class _LocalImports(cst.CSTVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_FunctionDef(self, node) -> bool:
        return False  # a nested function's imports are its own

    def visit_ClassDef(self, node) -> bool:
        return False

    def visit_ImportAlias(self, node: cst.ImportAlias) -> None:
        bound = node.asname.name if node.asname else node.name
        self.names.add(dotted(bound).split(".", 1)[0])


def local_imports(function: cst.FunctionDef) -> set[str]:
    """The names `function` binds by importing them in its own body."""
    found = _LocalImports()
    function.body.visit(found)
    return found.names


class _StringAnnotations(cst.CSTVisitor):
    """Names used inside the quoted parts of an annotation (`"FSDP"`, `Optional["nn.Module"]`)."""

    def __init__(self, used: _UsedNames) -> None:
        self.used = used

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if not isinstance(value, str):
            return
        try:
            expression = cst.parse_expression(value.strip())
        except cst.ParserSyntaxError:
            return
        expression.visit(self.used)


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
    kept[-1] = kept[-1].with_changes(comma=_relaid(original[-1].comma, kept[-1].comma))
    return kept


def _relaid(layout, comment_from, lines_too: bool = True):
    """The comma `layout` (with the line break after it, in a one-name-a-line import) carrying the
    end-of-line comment of the comma `comment_from` instead of its own: a name's comment stays
    with the name, and goes when the name goes. `lines_too=False` drops the comment lines below."""
    if not (isinstance(layout, cst.Comma) and isinstance(layout.whitespace_after, cst.ParenthesizedWhitespace)):
        return layout
    first_line = cst.TrailingWhitespace()
    if isinstance(comment_from, cst.Comma) and isinstance(comment_from.whitespace_after, cst.ParenthesizedWhitespace):
        first_line = comment_from.whitespace_after.first_line
    whitespace = layout.whitespace_after.with_changes(first_line=first_line)
    if not lines_too:
        whitespace = whitespace.with_changes(empty_lines=[])
    return layout.with_changes(whitespace_after=whitespace)


class _DropUnusedImports(cst.CSTTransformer):
    """Drops the imports nobody uses any more: FSDP1's, and those the input used."""

    def __init__(
        self, used: _UsedNames, used_before: _UsedNames, used_before_anywhere: _UsedNames, kept: frozenset, converted: bool
    ) -> None:
        super().__init__()
        self.converted = converted  # the rewrite wrote FSDP2 code here (not only TODO comments)
        self.used = used
        self.used_before = used_before
        self.used_before_anywhere = used_before_anywhere
        self.kept = kept  # module-level names other files of the program import from this one
        self.dropped: set[str] = set()  # module-level names whose FSDP imports went
        self.functions: list[cst.FunctionDef] = []  # the enclosing functions, innermost last
        self._inside: dict[int, _UsedNames] = {}  # the uses inside a function that imports, by its id
        self.emptied: set[int] = set()  # ids of the original import lines dropped whole
        self.keeps_fsdp1 = False  # some FSDP1 import is still used: the file stays partly FSDP1

    def visit_Module(self, node: cst.Module) -> None:
        self.keeps_fsdp1 = any(
            is_fsdp1(qualified) and _uses(self.used, alias, by_chain=True) for qualified, alias in import_aliases(node)
        )

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.append(node)

    def leave_FunctionDef(self, original, updated):
        self.functions.pop()
        return updated

    def leave_ImportFrom(self, original, updated):
        if updated.relative or isinstance(updated.names, cst.ImportStar):
            return updated
        module_name = dotted(updated.module)
        kept = [alias for alias in updated.names if not self._drop(f"{module_name}.{dotted(alias.name)}", alias)]
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        if len(kept) == 1 and updated.lpar is not None and "#" not in cst.Module([]).code_for_node(updated):
            # one name left of a parenthesised list: one line, as isort and black write it
            return updated.with_changes(names=[kept[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)], lpar=None, rpar=None)
        return updated.with_changes(names=_without_trailing_comma(kept, updated.names))

    def leave_Import(self, original, updated):
        kept = [alias for alias in updated.names if not self._drop(dotted(alias.name), alias)]
        if len(kept) == len(updated.names):
            return updated
        if not kept:
            return cst.RemoveFromParent()
        return updated.with_changes(names=_without_trailing_comma(kept, updated.names))

    def _drop(self, qualified: str, alias: cst.ImportAlias) -> bool:
        dropped = self._unused(qualified, alias)
        if dropped and not self.functions and qualified.startswith(FSDP_PACKAGE + "."):
            bound = dotted(alias.asname.name) if alias.asname is not None else dotted(alias.name).split(".", 1)[0]
            if bound in self.kept:
                return False  # imported from here by another file: a re-export
            self.dropped.add(bound)
        return dropped

    def _unused(self, qualified: str, alias: cst.ImportAlias) -> bool:
        # An import inside a function serves that function only.
        used, used_before = (self._used_inside(), self.used_before_anywhere) if self.functions else (self.used, self.used_before)
        by_chain = is_fsdp1(qualified)
        if by_chain and (self.converted or not self.keeps_fsdp1):
            return not _uses(used, alias, by_chain=True)  # a migrated file keeps no FSDP1 import it does not use
        if not _uses(used_before, alias, by_chain=by_chain):
            return False  # unused in the input too: a re-export or a side effect, not ours to judge
        return not _uses(used, alias, by_chain=by_chain)

    def _used_inside(self) -> _UsedNames:
        function = self.functions[-1]
        if id(function) not in self._inside:
            self._inside[id(function)] = inside = _UsedNames(scoped=False)
            function.body.visit(inside)
        return self._inside[id(function)]

    def leave_SimpleStatementLine(self, original, updated):
        if not updated.body:
            self.emptied.add(id(original))
            return cst.RemoveFromParent()
        return updated

    def leave_Module(self, original, updated):
        return updated.with_changes(body=self._lines_carried(original.body, updated.body))

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=self._lines_carried(original.body, updated.body))

    def _lines_carried(self, original: list, updated: list) -> list:
        """`updated` with the lines above each dropped import line (a blank line between import
        groups, a comment heading a group) moved to the statement that follows it."""
        kept, carried, dropped, remaining = [], [], False, iter(updated)
        for statement in original:
            if id(statement) in self.emptied:
                carried, dropped = [*carried, *statement.leading_lines], True
                continue
            statement = next(remaining)
            if dropped:
                own = list(statement.leading_lines)
                if not kept:  # now first in its block: no blank line above it
                    own = [*carried, *(line for line in own if line.comment)]
                elif not own:
                    own = carried
                elif any(line.comment for line in carried):
                    own = [*carried, *own]
                statement = statement.with_changes(leading_lines=own)
                carried, dropped = [], False
            kept.append(statement)
        return kept


def _uses(used: _UsedNames, alias: cst.ImportAlias, by_chain: bool) -> bool:
    """Whether the name `alias` binds is used; `import a.b` binds `a`, or with `by_chain`
    counts only while a chain spells out `a.b`."""
    if alias.asname is not None:
        return dotted(alias.asname.name) in used.names
    bound = dotted(alias.name)
    if "." not in bound:
        return bound in used.names
    if by_chain:
        return any(chain == bound or chain.startswith(bound + ".") for chain in used.chains)
    return bound.split(".", 1)[0] in used.names


def _already_imported(body, module_name: str, name: str | None, local: str) -> bool:
    for statement in body:
        if not is_import_line(statement):
            continue
        for imp in statement.body:
            if name is None and isinstance(imp, cst.Import):
                for alias in imp.names:
                    bound = dotted(alias.asname.name) if alias.asname else dotted(alias.name).split(".")[0]
                    if bound == local and (dotted(alias.name) == module_name or alias.asname is None):
                        return True
            if name is not None and isinstance(imp, cst.ImportFrom) and not imp.relative:
                if dotted(imp.module) != module_name or isinstance(imp.names, cst.ImportStar):
                    continue
                for alias in imp.names:
                    bound = dotted(alias.asname.name) if alias.asname else dotted(alias.name)
                    if dotted(alias.name) == name and bound == local:
                        return True
    return False


def _alias(name: str, local: str) -> cst.ImportAlias:
    asname = None if name == local else cst.AsName(name=cst.Name(local))
    return cst.ImportAlias(name=cst.Name(name), asname=asname)


def _alias_order(alias: cst.ImportAlias) -> tuple:
    """isort's order of the names of one `from` import: constants, classes, then the rest."""
    name = dotted(alias.name)
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower()


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
                names[-1] = names[-1].with_changes(comma=_relaid(between, closing, lines_too=False))
                new = [alias.with_changes(comma=_relaid(between, None, lines_too=False)) for alias in aliases]
                new[-1] = new[-1].with_changes(comma=_relaid(closing, None))
            else:
                comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                last = names[-1].comma
                if imp.rpar is None and names == sorted(names, key=_alias_order):  # kept sorted, as isort would
                    names, aliases = sorted([*names, *aliases], key=_alias_order), []
                names = [alias.with_changes(comma=comma) for alias in names]
                new = [alias.with_changes(comma=comma) for alias in aliases]
                (new or names)[-1] = (new or names)[-1].with_changes(comma=last)
            body = list(statement.body)
            body[index] = imp.with_changes(names=[*names, *new])
            return statement.with_changes(body=body)
    return None


def _is_fsdp_import(statement) -> bool:
    return is_import_line(statement) and any(_is_fsdp_module(m) for m in imported_modules(statement))


def _guarded_suites(statement, type_checking: bool = False) -> list[str]:
    """The suites of a module-level import guard (`try:`, a version check) that may hold imports, by
    attribute path; for `if TYPE_CHECKING:`, whose imports do not exist at run time, only when asked."""
    if isinstance(statement, cst.Try):
        return ["body"]
    if isinstance(statement, cst.If):
        if not type_checking and "TYPE_CHECKING" in cst.Module([]).code_for_node(statement.test):
            return []
        return ["body", "orelse.body"] if isinstance(statement.orelse, cst.Else) else ["body"]
    return []


def _suite_of(statement, path: str) -> cst.IndentedBlock | None:
    node = statement
    for attr in path.split("."):
        node = getattr(node, attr)
    return node if isinstance(node, cst.IndentedBlock) else None


def _with_suite(statement, path: str, body: list):
    if path == "body":
        return statement.with_changes(body=statement.body.with_changes(body=body))
    orelse = statement.orelse
    return statement.with_changes(orelse=orelse.with_changes(body=orelse.body.with_changes(body=body)))


def _import_bodies(body: list):
    """The module's body, then each guard's suite: (statements, put back) pairs, in file order."""
    yield body, None
    for index, statement in enumerate(body):
        for path in _guarded_suites(statement):
            suite = _suite_of(statement, path)
            if suite is not None and any(is_import_line(s) for s in suite.body):

                def put_back(statements, index=index, path=path):
                    body[index] = _with_suite(body[index], path, statements)

                yield list(suite.body), put_back


def _fsdp_import_guard(body: list):
    """The guard suite holding the first FSDP import when the module's FSDP imports are all guarded."""
    if any(_is_fsdp_import(statement) for statement in body):
        return None
    for statements, put_back in _import_bodies(body):
        if put_back is not None and any(_is_fsdp_import(s) for s in statements):
            return statements, put_back
    return None


def _import_position(body: list, package: str | None = None, module: str | None = None) -> int:
    """Where a new import line goes: before the first FSDP import (or, for `import package`, the first
    import from inside that package), else after the header's last import of `module`'s package, else
    after the header's imports."""
    last_import = same_package = None
    for index, statement in enumerate(body):
        if is_import_line(statement):
            inside = package is not None and any(m.startswith(package + ".") for m in imported_modules(statement))
            if inside or _is_fsdp_import(statement):
                return index
            last_import = index
            if module is not None and _package(_first_module(statement)) == _package(module):
                same_package = index
        elif not is_docstring(statement) and last_import is not None:
            break
    if same_package is not None:
        return same_package + 1
    if last_import is not None:
        return last_import + 1
    return 1 if body and is_docstring(body[0]) else 0


def _insert_import(body: list, line, package: str | None = None) -> None:
    module = _from_module(line)
    position = _import_position(body, package, module)
    new_section = False
    if module is not None and _is_stdlib(module):
        position = _stdlib_position(body, position)
        # the first import of the standard library, above the others': a section of its own
        new_section = position < len(body) and not _is_stdlib(_first_module(body[position]))
        new_section = new_section and (position == 0 or not _is_stdlib(_first_module(body[position - 1])))
    if module is not None:
        position = _sorted_position(body, position, module)
    # the last of the standard library's section: the next section keeps its blank line
    ends_section = module is not None and _is_stdlib(module) and not new_section
    ends_section = ends_section and position < len(body) and not _is_stdlib(_first_module(body[position]))
    # the last of its package's lines, before another section (the project's own imports): that keeps its blank line
    ends_section = ends_section or (
        module is not None
        and 0 < position < len(body)
        and _starts_block(body[position])
        and _package(_first_module(body[position - 1])) == _package(module) != _package(_first_module(body[position]))
    )
    if not ends_section and position < len(body) and is_import_line(body[position]):
        # Take over the comments above the line we are inserted before.
        line = line.with_changes(leading_lines=body[position].leading_lines)
        body[position] = body[position].with_changes(leading_lines=[cst.EmptyLine()] if new_section else [])
    body.insert(position, line)


def _from_line(module_name: str, aliases: list) -> cst.SimpleStatementLine:
    aliases = sorted(aliases, key=_alias_order)
    return cst.SimpleStatementLine([cst.ImportFrom(module=cst.parse_expression(module_name), names=aliases)])


def _from_module(statement) -> str | None:
    """The module of a line holding one absolute `from M import ...`."""
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        node = statement.body[0]
        if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
            return dotted(node.module)
    return None


def _first_module(statement) -> str:
    modules = imported_modules(statement) if is_import_line(statement) else []
    return modules[0] if modules else ""


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _stdlib_position(body: list, position: int) -> int:
    """For a standard-library module: before the header's first import of another module, when that comes
    before `position`."""
    for index in range(position):
        if is_import_line(body[index]) and not _is_stdlib(_first_module(body[index])):
            return index
    return position


def _package(module: str) -> str:
    return module.split(".", 1)[0]


def _starts_block(statement) -> bool:
    return any(isinstance(line, cst.EmptyLine) and line.comment is None for line in statement.leading_lines)


def _sorted_position(body: list, position: int, module: str) -> int:
    """`position` moved within its run of `from` imports to where isort would put `from module import ...`
    (a formatter run afterwards then leaves the line where it is)."""
    start = position
    while position > 0 and (_from_module(body[position - 1]) or "") > module:
        if _is_stdlib(_from_module(body[position - 1])) != _is_stdlib(module):
            break  # the standard library's section ends here
        position -= 1
        if _starts_block(body[position]):
            break  # now first of that line's section: further up is another section
    if position != start:
        return position
    while position < len(body) and _package(_from_module(body[position]) or "") == _package(module) and _from_module(body[position]) < module:
        if position + 1 < len(body) and _starts_block(body[position + 1]):
            return position + 1
        position += 1
    return position


def _add_imports(body: list, imports: dict, used: _UsedNames) -> None:
    by_module: dict[str, list] = {}
    for (module_name, name), local in imports.items():
        if local not in used.names:
            continue  # asked for, then not used: the rule took another way
        if any(_already_imported(statements, module_name, name, local) for statements, _ in _import_bodies(body)):
            continue
        if name is None:  # `import torch` (helpers only ask for top-level packages)
            asname = None if local == module_name else cst.AsName(name=cst.Name(local))
            alias = cst.ImportAlias(name=cst.parse_expression(module_name), asname=asname)
            _insert_import(body, cst.SimpleStatementLine([cst.Import(names=[alias])]), package=module_name)
        else:
            by_module.setdefault(module_name, []).append(_alias(name, local))
    for module_name, aliases in by_module.items():
        if _merge_anywhere(body, module_name, aliases):
            continue
        line = _from_line(module_name, aliases)
        guard = _fsdp_import_guard(body)
        if guard is None:
            _insert_import(body, line)
        else:
            statements, put_back = guard
            _insert_import(statements, line)
            put_back(statements)


def _merge_anywhere(body: list, module_name: str, aliases: list) -> bool:
    for statements, put_back in _import_bodies(body):
        for index, statement in enumerate(statements):
            merged = _merge_into(statement, module_name, aliases) if is_import_line(statement) else None
            if merged is not None:
                statements[index] = merged
                if put_back is not None:
                    put_back(statements)
                return True
    return False


def _is_import_header(statement) -> bool:
    if is_import_line(statement):
        return True
    suites = [_suite_of(statement, path) for path in _guarded_suites(statement, type_checking=True)]
    return any(suite is not None and any(is_import_line(s) for s in suite.body) for suite in suites)


def _helper_position(body: list) -> int:
    """After the last import (or import guard) before the first definition: helpers never split imports."""
    position = 1 if body and is_docstring(body[0]) else 0
    for index, statement in enumerate(body):
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            break
        if _is_import_header(statement):
            position = index + 1
    return position


def _add_helpers(body: list, helpers: dict) -> None:
    position = _helper_position(body)
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


def _called_helpers(module: cst.Module, helpers: dict) -> dict:
    """The helpers the finished code names, and the helpers those name: a rule may ask for one on a path whose
    code another rule then replaces (a load that converted to `set_model_state_dict` after all)."""
    wanted = [name for name in helpers if name in _used_names(module, scoped=False).names]
    needed = set()
    while wanted:
        name = wanted.pop()
        if name in needed:
            continue
        needed.add(name)
        inner = _UsedNames(scoped=False)
        for statement in helpers[name]:
            statement.visit(inner)
        wanted += [other for other in helpers if other in inner.names]
    return {name: statements for name, statements in helpers.items() if name in needed}


def _used_names(module: cst.Module, scoped: bool = True) -> _UsedNames:
    used = _UsedNames(scoped)
    module.visit(used)
    return used


def finish_module(
    module: cst.Module, imports: dict, helpers: dict, original: cst.Module, kept: frozenset = frozenset()
) -> tuple[cst.Module, set[str]]:
    """Add the helpers and the requested imports the output uses, then drop the imports nobody uses any more
    (except module-level names in `kept`); also the module-level names whose imports were dropped."""
    body = list(module.body)
    helpers = _called_helpers(module, helpers)
    if helpers:
        _add_helpers(body, helpers)
    module = module.with_changes(body=body)
    used = _used_names(module)
    _add_imports(body, imports, used)
    module = module.with_changes(body=body)
    if imports:
        module = module.visit(_ImportsIntoFunctions(imports))
    dropper = _DropUnusedImports(used, _used_names(original), _used_names(original, scoped=False), kept, bool(imports))
    module = module.visit(dropper)
    return module.visit(_DropDeadBlocks()), dropper.dropped


class _ImportsIntoFunctions(cst.CSTTransformer):
    """The requested imports a function needs for itself: one that imports a name in its own body
    holds it as a local throughout (a module-level import does not reach it), so the FSDP2 import
    goes into the function, in the block of its first FSDP import line."""

    def __init__(self, imports: dict) -> None:
        super().__init__()
        self.imports = imports
        self.needed: list[list] = []  # per enclosing function: [(module, name, local)] still to place

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        bound = local_imports(node) & set(self.imports.values())
        if bound:
            inside = _UsedNames(scoped=False)
            node.body.visit(inside)
            bound &= inside.names
        self.needed.append([(m, n, local) for (m, n), local in self.imports.items() if local in bound])

    def leave_FunctionDef(self, original, updated):
        self.needed.pop()
        return updated

    def leave_IndentedBlock(self, original, updated):
        if not self.needed or not self.needed[-1]:
            return updated
        position = next((i for i, s in enumerate(updated.body) if _is_fsdp_import(s)), None)
        if position is None:
            return updated
        body = list(updated.body)
        by_module: dict[str, list] = {}
        for module_name, name, local in self.needed[-1]:
            if not _already_imported(body, module_name, name, local):
                by_module.setdefault(module_name, []).append(_alias(name, local))
        for module_name, aliases in by_module.items():
            _insert_import(body, _from_line(module_name, aliases))
        self.needed[-1] = []
        return updated.with_changes(body=body)


class _DropDeadBlocks(cst.CSTTransformer):
    """Statements whose block the rewrite emptied go whole: `for m in models:` over nothing,
    `if ...:` / `try:` around a dropped import, `with` around nothing; an emptied `else:` goes.

    An emptied block is one with no statement at all (LibCST writes it `pass`): a `pass` of the
    user's own is a statement, and stays. Where the construct cannot go (a `def`, an `if` with an
    `else:`), the block gets an explicit `pass`.
    """

    def leave_If(self, original, updated):
        if _emptied(updated.orelse) or isinstance(updated.orelse, _Removed):  # the latter: a trailing `elif` that went
            updated = updated.with_changes(orelse=None)
        if not _emptied(updated.body):
            return updated
        if updated.orelse is None:
            return _removed(updated)
        if isinstance(updated.orelse, cst.Else):  # `if not test:` over the `else:` body
            return updated.with_changes(test=negated(updated.test), body=updated.orelse.body, orelse=None)
        rest = updated.orelse
        if rest.orelse is None:  # `if not test and other:` for `if test: <nothing> elif other: ...`
            return updated.with_changes(test=conjunction([negated(updated.test), rest.test]), body=rest.body, orelse=None)
        inner = rest.with_changes(leading_lines=[])  # the rest of the chain under `if not test:`
        return updated.with_changes(test=negated(updated.test), body=cst.IndentedBlock([inner]), orelse=None)

    def leave_For(self, original, updated):
        return self._loop(updated)

    def leave_While(self, original, updated):
        return self._loop(updated)

    def _loop(self, updated):
        if _emptied(updated.orelse):
            updated = updated.with_changes(orelse=None)
        if _emptied(updated.body) and updated.orelse is None:
            return _removed(updated)
        return _with_pass(updated) if _emptied(updated.body) else updated

    def leave_With(self, original, updated):
        return _removed(updated) if _emptied(updated.body) else updated

    def leave_Try(self, original, updated):
        if _emptied(updated.body) and updated.finalbody is None:
            return _removed(updated)  # nothing to try: its handlers and `else:` cannot run either
        return _with_pass(updated) if _emptied(updated.body) else updated

    def leave_IndentedBlock(self, original, updated):
        return updated.with_changes(body=_carry_removed(updated.body))

    def leave_Module(self, original, updated):
        return updated.with_changes(body=_carry_removed(updated.body))

    def leave_FunctionDef(self, original, updated):
        return _with_pass(updated) if _emptied(updated.body) else updated

    def leave_ClassDef(self, original, updated):
        return _with_pass(updated) if _emptied(updated.body) else updated


class _Removed(cst.SimpleStatementLine):
    """A dead statement on its way out: its comment lines go to the next statement."""


class _CommentLines(cst.CSTVisitor):
    def __init__(self) -> None:
        self.lines: list[cst.EmptyLine] = []

    def visit_EmptyLine(self, node: cst.EmptyLine) -> None:
        if node.comment is not None:
            self.lines.append(node.with_changes(indent=True))


def _removed(statement):
    """`statement` marked to go; its comment lines (above it, or left in its emptied blocks) stay."""
    comments = _CommentLines()
    statement.visit(comments)
    return _Removed(body=[cst.Pass()], leading_lines=comments.lines)


def _carry_removed(statements) -> list:
    kept, pending = [], []
    for statement in statements:
        if isinstance(statement, _Removed):
            pending.extend(statement.leading_lines)
            continue
        if pending:
            statement = statement.with_changes(leading_lines=[*statement.leading_lines, *pending])
            pending = []
        kept.append(statement)
    return kept


def _emptied(node) -> bool:
    suite = node.body if isinstance(node, (cst.Else, cst.Finally)) else node
    return isinstance(suite, cst.IndentedBlock) and not suite.body


def _with_pass(statement):
    return statement.with_changes(body=statement.body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
