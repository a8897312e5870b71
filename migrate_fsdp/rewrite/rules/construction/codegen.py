"""Building the FSDP2 code the construction rules emit.

Generated code is written as readable templates whose placeholders (upper-case
names) are filled with nodes, so that it reads like what a person would write
and the user's own sub-expressions keep their exact text. References to torch
reuse the names the file already binds (`torch`, `dist`, `nn`), so the output
does not grow a second spelling of the same module.
"""

import json
import textwrap

import libcst as cst
from libcst.metadata import Scope

_NO_SPACE = cst.SimpleWhitespace("")
_SPACE = cst.SimpleWhitespace(" ")


class _Fill(cst.CSTTransformer):
    """A template's placeholders filled, each value in parentheses only where it stands needs them."""

    def __init__(self, values: dict) -> None:
        super().__init__()
        self.values = values
        self.parents: list = []

    def on_visit(self, node) -> bool:
        self.parents.append(node)
        return super().on_visit(node)

    def on_leave(self, original, updated):
        self.parents.pop()
        return super().on_leave(original, updated)

    def leave_Name(self, original, updated):
        value = self.values.get(updated.value)
        if value is None:
            return updated
        if updated.lpar:  # `(PLACEHOLDER)` in a template keeps its parentheses
            return value.with_changes(lpar=updated.lpar, rpar=updated.rpar)
        parent = self.parents[-1] if self.parents else None
        if isinstance(parent, _WHOLE) and not isinstance(value, cst.Tuple):
            return value  # `if COND:`, `x = VALUE`, `f(ARG)`: nothing binds tighter around it
        if isinstance(parent, cst.BooleanOperation):
            return _operand(value, type(parent.operator))
        if isinstance(parent, cst.Arg):
            return parenthesized(value)  # `f(a, (x if c else y))` reads better so
        return grouped(value)


# Where a placeholder stands as a whole expression: an `if` / `while` test, an assigned or returned value.
_WHOLE = (cst.If, cst.While, cst.Assign, cst.AnnAssign, cst.Return, cst.Expr)


# Expressions that need parentheses inside `a and X`, `X.attr`, `X(...)`.
_LOOSE = (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr, cst.UnaryOperation, cst.BinaryOperation, cst.Comparison)


def grouped(node):
    """`node` in parentheses when an operator inside it binds more loosely than a call or attribute."""
    return parenthesized(node, _LOOSE)


# Expressions that need parentheses as a part of a conditional expression or a boolean operation.
_CONDITIONAL = (cst.IfExp, cst.Lambda, cst.NamedExpr)


def parenthesized(node, loose=_CONDITIONAL):
    """`node` in parentheses when it is one of `loose` and has none (by default: where it stands as a part of
    `a if t else b` or of `a or b`, which would read it differently)."""
    if isinstance(node, loose) and not node.lpar:
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def _node(value):
    return cst.parse_expression(value) if isinstance(value, str) else value


def expression(template: str, **values) -> cst.BaseExpression:
    """`template` parsed as an expression, its upper-case placeholders replaced by `values`."""
    filled = {key: _node(value) for key, value in values.items()}
    return cst.parse_expression(template).visit(_Fill(filled))


def statements(template: str, **values) -> list[cst.BaseStatement]:
    """`template` parsed as statements (any indentation), placeholders replaced by `values`."""
    filled = {key: _node(value) for key, value in values.items()}
    module = cst.parse_module(textwrap.dedent(template).strip("\n") + "\n")
    body = [statement.visit(_Fill(filled)) for statement in module.body]
    if module.header:  # a comment on the first line belongs to the first statement
        body[0] = body[0].with_changes(leading_lines=[*module.header, *body[0].leading_lines])
    return body


def assign(name: str, value: cst.BaseExpression) -> cst.SimpleStatementLine:
    """`name = value`, the value without the parentheses a template would give it (`x = a if c else b`).

    A value the user wrote over several lines inside an argument list, moved here, is written on one line,
    which the layout splits again at this depth where it is long; one holding a comment or a multi-line string
    keeps its lines as they were.
    """
    value = _one_line(value)
    if "\n" in cst.Module([]).code_for_node(value) and not value.lpar and isinstance(value, _UNBRACKETED):
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])  # its line breaks need brackets
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)])


# Values whose line breaks may stand outside any bracket of theirs (`a\n if c\n else b` moved out of an argument
# list); in the others (a dict, a call, a lookup) they can only be inside the value's own brackets.
_UNBRACKETED = (cst.IfExp, cst.BooleanOperation, cst.BinaryOperation, cst.Comparison, cst.UnaryOperation, cst.Lambda)


def _one_line(value: cst.BaseExpression) -> cst.BaseExpression:
    code = cst.Module([]).code_for_node(value)
    if "\n" not in code or "#" in code or '"""' in code or "'''" in code:
        return value
    flat = value.visit(_OneLine())
    if flat.lpar and not isinstance(flat, cst.Tuple):
        flat = flat.with_changes(lpar=[], rpar=[])
    return flat


class _OneLine(cst.CSTTransformer):
    """Every line break inside brackets becomes a space (none after an opening or before a closing one)."""

    def leave_ParenthesizedWhitespace(self, original, updated):
        return _SPACE

    def _inner(self, updated, attribute):
        return updated.with_changes(**{attribute: _NO_SPACE})

    def leave_LeftParen(self, original, updated):
        return self._inner(updated, "whitespace_after")

    def leave_LeftBracket(self, original, updated):
        return self._inner(updated, "whitespace_after")

    def leave_LeftCurlyBrace(self, original, updated):
        return self._inner(updated, "whitespace_after")

    def leave_RightParen(self, original, updated):
        return self._inner(updated, "whitespace_before")

    def leave_RightBracket(self, original, updated):
        return self._inner(updated, "whitespace_before")

    def leave_RightCurlyBrace(self, original, updated):
        return self._inner(updated, "whitespace_before")

    def leave_Call(self, original, updated):
        # `f(\n    a,\n)` over lines: no space after its bracket, no trailing comma
        return updated.with_changes(whitespace_before_args=_NO_SPACE, args=_no_trailing_comma(updated.args))

    def leave_Dict(self, original, updated):
        return updated.with_changes(elements=_no_trailing_comma(updated.elements))

    def leave_List(self, original, updated):
        return updated.with_changes(elements=_no_trailing_comma(updated.elements))


def _no_trailing_comma(items) -> list:
    if items and isinstance(items[-1].comma, cst.Comma):
        return [*items[:-1], items[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]
    return list(items)


def keyword(name: str, value, comma=cst.MaybeSentinel.DEFAULT) -> cst.Arg:
    return cst.Arg(
        value=_node(value),
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=_NO_SPACE, whitespace_after=_NO_SPACE),
        comma=comma,
    )


def call(func: str, *args, **kwargs) -> cst.Call:
    """`func(args..., name=value...)` on one line."""
    parts = [cst.Arg(value=_node(arg)) for arg in args]
    parts += [keyword(name, value) for name, value in kwargs.items()]
    return cst.Call(func=_node(func), args=with_commas(parts))


def prepended(updated: cst.Call, func: str, *first) -> cst.Call:
    """`func(first..., <the arguments of updated>)`: a method call made a function's (`model.load_state_dict(sd)`
    -> `helper(model, sd)`), its arguments laid out as they were (one a line where they were)."""
    opening = updated.whitespace_before_args
    between = opening if isinstance(opening, cst.ParenthesizedWhitespace) else _SPACE
    new = [cst.Arg(value=_node(arg), comma=cst.Comma(whitespace_after=between)) for arg in first]
    if not updated.args:
        new[-1] = new[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated.with_changes(func=_node(func), args=[*new, *updated.args])


def with_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    """`args` separated by ", " (the last one without a comma)."""
    comma = cst.Comma(whitespace_after=_SPACE)
    return [arg.with_changes(comma=comma if i < len(args) - 1 else cst.MaybeSentinel.DEFAULT) for i, arg in enumerate(args)]


def string(text: str) -> cst.SimpleString:
    """A double-quoted string literal (the quotes most Python code uses)."""
    return cst.SimpleString(json.dumps(text))


# Comparisons whose negation is another operator whatever the operands (not the orderings: NaN).
_NEGATED = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.In: cst.NotIn, cst.NotIn: cst.In, cst.Is: cst.IsNot, cst.IsNot: cst.Is}


def negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """`not test` as a person writes it: `a != b` for `a == b`, `x` for `not x`."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        return test.expression.with_changes(lpar=[], rpar=[]) if isinstance(test.expression, cst.Comparison) else test.expression
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and type(test.comparisons[0].operator) in _NEGATED:
        target = test.comparisons[0]
        operator = _NEGATED[type(target.operator)]()
        if isinstance(operator, (cst.NotIn, cst.IsNot)):
            operator = operator.with_changes(whitespace_before=target.operator.whitespace_before)
        return test.with_changes(comparisons=[target.with_changes(operator=operator)], lpar=[], rpar=[])
    return expression("not TEST", TEST=test)


def conjunction(tests: list) -> cst.BaseExpression:
    """`a and b and ...`."""
    return _joined(tests, cst.And)


def disjunction(tests: list) -> cst.BaseExpression:
    """`a or b or ...`."""
    return _joined(tests, cst.Or)


def _joined(tests: list, operator) -> cst.BaseExpression:
    joined = _operand(tests[0], operator)
    for test in tests[1:]:
        joined = cst.BooleanOperation(left=joined, operator=operator(), right=_operand(test, operator))
    return joined


def _operand(node, operator):
    """`node` in parentheses where, as an operand of `operator`, it would read differently (a conditional, `a or b`
    under `and`)."""
    if operator is cst.And and isinstance(node, cst.BooleanOperation) and isinstance(node.operator, cst.Or):
        return parenthesized(node, cst.BooleanOperation)
    return parenthesized(node)


def is_reevaluable(node) -> bool:
    """A name or attribute chain: evaluating it again gives the same object without side effects."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def is_lookup(node) -> bool:
    """A name, attribute chain or subscript of them by such a value or a literal (`PRECISION[args.precision]`):
    no side effect where it is evaluated, so it may be read a little earlier."""
    if isinstance(node, cst.Subscript):
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return False
        index = node.slice[0].slice.value
        return is_lookup(node.value) and (is_lookup(index) or isinstance(index, (cst.SimpleString, cst.Integer)))
    return is_reevaluable(node)


class Names:
    """Local names for the code a file gains: fresh variables, and torch references."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self._bindings: dict[int, dict[str, str]] = {}
        self.released: set = set()  # assignments the rewrite removes: their names are free again
        self.statements: dict[int, cst.CSTNode] = {}  # anchor -> the statement its variables are set before
        self._given: dict[tuple[int, str], tuple[int, int]] = {}  # (scope, name) -> (statement, anchor) last given

    def fresh(self, anchor: cst.CSTNode, *candidates: str) -> str:
        """The first candidate (then `candidate_2`, ...) that nothing in `anchor`'s scope binds, nor was given to
        another anchor of the same statement (two constructors in one statement each set theirs before it)."""
        scope = self.ctx.scope(anchor)
        mine = (id(self.statements.get(id(anchor), anchor)), id(anchor))
        for suffix in ("", "_2", "_3", "_4", "_5"):
            for candidate in candidates:
                name = candidate + suffix
                given = self._given.get((id(scope), name), mine)
                if given[0] == mine[0] and given[1] != mine[1]:
                    continue
                if scope is None or name not in scope or all(a in self.released for a in scope[name]):
                    self._given[(id(scope), name)] = mine
                    return name
        raise ValueError(f"no free name among {candidates}")

    def ref(self, anchor: cst.CSTNode, qualified: str) -> str:
        """Source text reaching `qualified` (e.g. torch.distributed.get_rank) from `anchor`."""
        bindings = self._visible(self.ctx.scope(anchor))
        parts = qualified.split(".")
        for cut in range(len(parts), 0, -1):
            local = bindings.get(".".join(parts[:cut]))
            if local is not None:
                return ".".join([local, *parts[cut:]])
        module, _, name = qualified.rpartition(".")
        return self.ctx.require_import(module, name)

    def _visible(self, scope: Scope | None) -> dict[str, str]:
        """Qualified module/object name -> local name, for imports visible in `scope`."""
        if scope is None:
            return {}
        key = id(scope)
        if key not in self._bindings:
            found = dict(self._visible(scope.parent)) if scope.parent is not scope else {}
            for assignment in scope.assignments:  # an inner import wins over an outer one
                if not isinstance(getattr(assignment, "node", None), (cst.Import, cst.ImportFrom)):
                    continue
                for qualified in scope.get_qualified_names_for(assignment.name):
                    found[qualified.name] = assignment.name
            self._bindings[key] = found
        return self._bindings[key]
