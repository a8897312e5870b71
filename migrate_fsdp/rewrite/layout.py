"""Lines the rewrite made too long, split at their brackets as black would.

`get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))`
in place of `model.state_dict()` can take a line from 80 characters to 160.
A maintainer would not merge that, and a formatter run afterwards would
reflow the user's own lines too. So a statement the rewrite wrote or changed
that now runs past the file's line length is split at its outermost bracket:
the arguments on one indented line when they fit there, else one a line with
a trailing comma, splitting an argument in turn when it is still too long.
An import grown too long (`from torch.distributed.fsdp import ...` with the
names the rewrite added) gets a name a line, as black lays it out.
Lines the file already had are left as they were, however long.

The line length is the file's own: the one its lines keep to (black's 88,
or longer where the file's code already runs longer; comments and strings do
not count), so the output reads like the rest of the file.
"""

import io
import tokenize

import libcst as cst

BLACK_LINE = 88
_INDENT = 4


def line_length(source: str) -> int:
    """The line length a file keeps to: black's default, or the length of its longest lines of code.

    Strings do not count, nor do the brackets and comma closing a string that starts its line
    (`"a message of 160 characters",`): black leaves such a line long in a file that keeps to 88."""
    longest = 0
    row = 0
    string_line = after_string = False
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.start[0] != row:
                row, string_line = token.start[0], token.type == tokenize.STRING
            if token.type == tokenize.STRING or after_string and string_line and token.string in _CLOSING:
                after_string = True
                continue
            after_string = False
            if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
                longest = max(longest, token.end[1])
    except (tokenize.TokenError, SyntaxError):
        return BLACK_LINE
    return max(BLACK_LINE, longest)


_CLOSING = frozenset({",", ")", "]", "}", ":"})


def wrap_long_lines(module: cst.Module, original_source: str, verbatim: frozenset[str] = frozenset()) -> cst.Module:
    """`module` with each new one-line statement longer than the file's line length split at its brackets; lines
    in `verbatim` (stripped) are inserted as they are written elsewhere, and stay so."""
    kept = {line.strip() for line in original_source.splitlines()} | verbatim
    return module.visit(_Wrapper(module, line_length(original_source), kept))


class _Wrapper(cst.CSTTransformer):
    def __init__(self, module: cst.Module, limit: int, kept: set) -> None:
        self.module = module
        self.limit = limit
        self.kept = kept
        self.indents: list[str] = []

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.indents.append(node.indent if node.indent is not None else self.module.default_indent)

    def leave_IndentedBlock(self, original, updated):
        self.indents.pop()
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if len(updated.body) != 1:
            return updated
        code = self._code(updated.with_changes(leading_lines=())).rstrip("\r\n")
        indent = len("".join(self.indents))
        if "\n" in code:
            if self._moved_container(updated, code):
                statement = updated.body[0]
                return updated.with_changes(body=[statement.with_changes(value=self._split(statement.value, indent, 0))])
            return self._long_arguments_split(updated, indent)
        if indent + len(code) <= self.limit or code.strip() in self.kept:
            return updated
        statement = updated.body[0]
        if isinstance(statement, cst.ImportFrom) and not isinstance(statement.names, cst.ImportStar):
            return updated.with_changes(body=[_import_exploded(statement)])
        part = "exc" if isinstance(statement, cst.Raise) else "value"
        value = getattr(statement, part, None)
        if not _splittable(value):
            return updated
        return updated.with_changes(body=[statement.with_changes(**{part: self._split(value, indent, 0)})])

    def _moved_container(self, line, code: str) -> bool:
        """A new assignment of a table written over several lines (`param_dtype = {...}[args.precision]` taken out
        of an FSDP1 call's arguments): its lines kept the indentation they had in the call, so it is laid out anew."""
        statement = line.body[0]
        value = getattr(statement, "value", None)
        if not isinstance(statement, (cst.Assign, cst.AnnAssign)) or code.split("\n", 1)[0].strip() in self.kept:
            return False
        table = value.value if isinstance(value, cst.Subscript) else value
        return isinstance(table, (cst.Dict, cst.List)) and bool(table.elements)

    def _long_arguments_split(self, line, indent: int):
        """A call or a dict / list laid out an item a line (the user's layout, kept) whose item the rewrite made
        too long (`mp_policy=A if bf16 else B`, `"model": fsdp2_full_state_dict(get_model_state_dict(...), ...)`):
        that item split in turn."""
        statement = line.body[0]
        container = getattr(statement, "value", None)
        if isinstance(container, (cst.ListComp, cst.SetComp, cst.DictComp)):
            return self._long_comprehension_split(line, indent)
        opening = _opening(container)
        if not isinstance(opening, cst.ParenthesizedWhitespace):
            return line
        level = len(opening.last_line.value)
        items = []
        for item in _items(container):
            text = self._code(item.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip()
            mine = text in self.kept or f"{text}," in self.kept  # the user's own line, however long
            long = "\n" not in text and indent + level + len(text) + 1 > self.limit and not mine
            if long and _splittable(item.value):
                item = item.with_changes(value=self._split(item.value, indent, level))
            items.append(item)
        field = "args" if isinstance(container, cst.Call) else "elements"
        return line.with_changes(body=[statement.with_changes(value=container.with_changes(**{field: items}))])

    def _long_comprehension_split(self, line, indent: int):
        """A comprehension in brackets on lines of their own (the user's layout, kept) whose one line the rewrite
        made too long (`key: v for key, v in fsdp2_full_state_dict(...).items() if key in keep`): black's split."""
        statement = line.body[0]
        comprehension = statement.value
        body = self._code(comprehension).strip()[1:-1].strip()
        opening = comprehension.lbracket if isinstance(comprehension, cst.ListComp) else comprehension.lbrace
        if "\n" in body or body in self.kept or not isinstance(opening.whitespace_after, cst.ParenthesizedWhitespace):
            return line
        if indent + len(opening.whitespace_after.last_line.value) + len(body) <= self.limit:
            return line
        return line.with_changes(body=[statement.with_changes(value=self._split_comprehension(comprehension, indent, 0))])

    def leave_For(self, original, updated):
        """A `for` header the rewrite made too long (`for module in _fsdp1_wrap_targets(...):`): its iterable split."""
        if not isinstance(updated.iter, cst.Call):
            return updated
        return self._header_split(updated, "iter")

    def leave_If(self, original, updated):
        """An `if` / `elif` test the rewrite made too long (`if isinstance(module, (... if mp else ())):`): split."""
        if "\n" in self._code(updated.test):
            return updated
        return self._header_split(updated, "test")

    def _header_split(self, statement, part: str):
        """`statement` with its header's expression `part` split at its brackets, when the header runs too long."""
        header = self._code(statement.with_changes(leading_lines=())).split("\n", 1)[0]
        indent = len("".join(self.indents))
        expression = getattr(statement, part)
        if indent + len(header) <= self.limit or header.strip() in self.kept or not _splittable(expression):
            return statement
        return statement.with_changes(**{part: self._split(expression, indent, 0)})

    def _code(self, node) -> str:
        return self.module.code_for_node(node)

    def _split(self, node, start: int, level: int):
        """`node` split at its brackets, its opening bracket on a line indented by `level` past the statement's
        indentation `start`."""
        if isinstance(node, cst.IfExp):
            return self._split_conditional(node, start, level)
        if isinstance(node, cst.BooleanOperation):
            return self._split_boolean(node, start, level)
        if isinstance(node, _COMPREHENSIONS):
            return self._split_comprehension(node, start, level)
        if isinstance(node, cst.Subscript):  # `{...}[key]`: the table's brackets
            return node.with_changes(value=self._split(node.value, start, level))
        inner = level + _INDENT
        items = _items(node)
        hugged = " ".join(self._code(item).strip() for item in items)
        alone = len(items) == 1 and not _splittable(items[0].value)  # a long string: black leaves it long
        if (start + inner + len(hugged) <= self.limit or alone) and isinstance(node, cst.Call):
            return _laid_out(node, items, inner, level, one_a_line=False)
        split_items = []
        for item in items:
            text = self._code(item.with_changes(comma=cst.MaybeSentinel.DEFAULT)).strip()
            if start + inner + len(text) + 1 > self.limit and _splittable(item.value):
                item = item.with_changes(value=self._split(item.value, start, inner))
            split_items.append(item)
        return _laid_out(node, split_items, inner, level, one_a_line=True)

    def _split_comprehension(self, node, start: int, level: int):
        """`[elt for x in xs if c]` with its element, each `for` and each `if` on a line of its own (black's split),
        an element still too long split in turn."""
        inner = level + _INDENT

        def laid_out(comp_for: cst.CompFor) -> cst.CompFor:
            ifs = [test.with_changes(whitespace_before=_newline(inner)) for test in comp_for.ifs]
            nested = laid_out(comp_for.inner_for_in) if comp_for.inner_for_in is not None else None
            header = self._code(comp_for.with_changes(ifs=[], inner_for_in=None)).strip()
            iterated = comp_for.iter
            if start + inner + len(header) > self.limit:
                iterated = self._split_chain(iterated, start, inner)
            return comp_for.with_changes(whitespace_before=_newline(inner), iter=iterated, ifs=ifs, inner_for_in=nested)

        changes = {"for_in": laid_out(node.for_in)}
        element = "value" if isinstance(node, cst.DictComp) else "elt"
        value = getattr(node, element)
        text = self._code(node.key if isinstance(node, cst.DictComp) else value).strip()
        if start + inner + len(text) > self.limit and _splittable(value):
            changes[element] = self._split(value, start, inner)
        if isinstance(node, cst.ListComp):
            changes["lbracket"] = cst.LeftSquareBracket(whitespace_after=_newline(inner))
            changes["rbracket"] = cst.RightSquareBracket(whitespace_before=_newline(level))
        elif isinstance(node, cst.GeneratorExp):
            changes["lpar"] = [cst.LeftParen(whitespace_after=_newline(inner))]
            changes["rpar"] = [cst.RightParen(whitespace_before=_newline(level))]
        else:
            changes["lbrace"] = cst.LeftCurlyBrace(whitespace_after=_newline(inner))
            changes["rbrace"] = cst.RightCurlyBrace(whitespace_before=_newline(level))
        return node.with_changes(**changes)

    def _split_chain(self, node, start: int, level: int):
        """`f(a, b).items()`: split at the last call of the chain that has arguments (black's split), else as is."""
        if isinstance(node, cst.Call) and node.args:
            return self._split(node, start, level) if _splittable(node) else node
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            return node.with_changes(func=self._split_chain(node.func, start, level))
        if isinstance(node, cst.Attribute):
            return node.with_changes(value=self._split_chain(node.value, start, level))
        return node

    def _split_boolean(self, node: cst.BooleanOperation, start: int, level: int) -> cst.BooleanOperation:
        """`a and b and c` in parentheses, an operand a line with its operator first (black's split), an operand
        still too long split in turn."""
        inner = level + _INDENT

        def part(value):
            text = self._code(value).strip()
            if start + inner + len("and ") + len(text) > self.limit and _splittable(value):
                return self._split(value, start, inner)
            return value

        def laid_out(link):
            left = link.left
            same = isinstance(left, cst.BooleanOperation) and type(left.operator) is type(link.operator) and not left.lpar
            operator = link.operator.with_changes(whitespace_before=_newline(inner))
            return link.with_changes(left=laid_out(left) if same else part(left), operator=operator, right=part(link.right))

        return laid_out(node).with_changes(
            lpar=[cst.LeftParen(whitespace_after=_newline(inner))], rpar=[cst.RightParen(whitespace_before=_newline(level))]
        )

    def _split_conditional(self, node: cst.IfExp, start: int, level: int) -> cst.IfExp:
        """`a if t else b if u else c` in parentheses, a line for each part (black's ternary split), a part that is
        still too long split in turn."""
        inner = level + _INDENT

        def part(value):
            text = self._code(value).strip()
            if start + inner + len("else ") + len(text) > self.limit and _splittable(value):
                return self._split(value, start, inner)  # a conditional here has its own parentheses
            return value

        def laid_out(link):
            orelse = link.orelse
            orelse = laid_out(orelse) if isinstance(orelse, cst.IfExp) and not orelse.lpar else part(orelse)
            return link.with_changes(
                body=part(link.body),
                orelse=orelse,
                whitespace_before_if=_newline(inner),
                whitespace_before_else=_newline(inner),
            )

        return laid_out(node).with_changes(
            lpar=[cst.LeftParen(whitespace_after=_newline(inner))], rpar=[cst.RightParen(whitespace_before=_newline(level))]
        )


def _import_exploded(statement: cst.ImportFrom) -> cst.ImportFrom:
    """`from m import (` a name a line, with a trailing comma `)`, as black lays out an import too long."""
    names = [
        alias.with_changes(comma=cst.Comma(whitespace_after=_newline(_INDENT) if index < len(statement.names) - 1 else cst.SimpleWhitespace("")))
        for index, alias in enumerate(statement.names)
    ]
    return statement.with_changes(
        names=names, lpar=cst.LeftParen(whitespace_after=_newline(_INDENT)), rpar=cst.RightParen(whitespace_before=_newline(0))
    )


_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def _splittable(node) -> bool:
    if isinstance(node, cst.Subscript):
        return _splittable(node.value) and not node.value.lpar
    if isinstance(node, cst.IfExp):
        return True
    if isinstance(node, cst.BooleanOperation):
        return True  # its parentheses, if any, are laid out anew
    if isinstance(node, _COMPREHENSIONS):
        return not isinstance(node, cst.GeneratorExp) or bool(node.lpar)  # a call's only argument shares its brackets
    if isinstance(node, cst.Call):
        args = node.args
        return bool(args) and not any(isinstance(a.value, cst.GeneratorExp) and not a.value.lpar for a in args)
    if isinstance(node, cst.Tuple):
        return bool(node.lpar) and bool(node.elements)  # a bare tuple's items are not bracketed
    return isinstance(node, (cst.Dict, cst.List)) and bool(node.elements)


def _opening(node):
    """The whitespace after the opening bracket of a call or a dict / list display, None for anything else."""
    if isinstance(node, cst.Call):
        return node.whitespace_before_args
    if isinstance(node, cst.Dict):
        return node.lbrace.whitespace_after
    if isinstance(node, cst.List):
        return node.lbracket.whitespace_after
    return None


def _items(node) -> list:
    return list(node.args) if isinstance(node, cst.Call) else list(node.elements)


def _newline(extra: int) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(), empty_lines=[], indent=True, last_line=cst.SimpleWhitespace(" " * extra)
    )


def _laid_out(node, items: list, inner: int, outer: int, one_a_line: bool):
    """`node` with `items` on lines of their own indented by `inner` (past the statement's indentation), all on
    one line unless `one_a_line`, and its closing bracket on a line indented by `outer`."""
    if one_a_line:
        between = cst.Comma(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=_newline(inner))
        last = cst.Comma(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=_newline(outer))
        items = [item.with_changes(comma=between) for item in items[:-1]] + [items[-1].with_changes(comma=last)]
        closing = cst.SimpleWhitespace("")
    else:
        between = cst.Comma(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" "))
        items = [item.with_changes(comma=between) for item in items[:-1]] + [
            items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        ]
        closing = _newline(outer)
    if isinstance(node, cst.Call):
        if not one_a_line:
            items[-1] = items[-1].with_changes(whitespace_after_arg=closing)
        return node.with_changes(args=items, whitespace_before_args=_newline(inner))
    if isinstance(node, cst.Dict):
        return node.with_changes(
            elements=items,
            lbrace=cst.LeftCurlyBrace(whitespace_after=_newline(inner)),
            rbrace=cst.RightCurlyBrace(whitespace_before=closing),
        )
    if isinstance(node, cst.Tuple):
        return node.with_changes(
            elements=items,
            lpar=[cst.LeftParen(whitespace_after=_newline(inner))],
            rpar=[cst.RightParen(whitespace_before=closing)],
        )
    return node.with_changes(
        elements=items,
        lbracket=cst.LeftSquareBracket(whitespace_after=_newline(inner)),
        rbracket=cst.RightSquareBracket(whitespace_before=closing),
    )
