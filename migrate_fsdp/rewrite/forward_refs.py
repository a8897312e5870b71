"""String annotations (`Optional["ShardedGradScaler"]`, `"FSDP | None"`).

A forward reference spells class names in a string, where no scope analysis
sees them: left alone, an FSDP1 name in one would stay in a converted file with
nobody told. Here such strings are read (which FSDP1 names they spell) and
respelled (each such name replaced by its FSDP2 class), so that rules convert
them with the code around them and the leftover check reports the rest.
"""

import libcst as cst

from migrate_fsdp.rewrite.names import canonical, is_fsdp1
from migrate_fsdp.rewrite.syntax import children, dotted


def in_annotation(stack) -> bool:
    return any(isinstance(node, cst.Annotation) for node in stack)


def spelled_fsdp1_names(ctx, string: cst.SimpleString) -> set[str]:
    """The FSDP1 qualified names the annotation `string` spells."""
    return {name for names in _chains(ctx, _parse(string)).values() for name in names if is_fsdp1(name)}


def respell(ctx, string: cst.SimpleString, replacements: dict[str, str]) -> cst.SimpleString | None:
    """`string` with every name spelling a key of `replacements` (qualified) written as its value;
    None when it spells none of them."""
    expression = _parse(string)
    chains = _chains(ctx, expression)
    targets = {text: replacements[next(iter(names & replacements.keys()))] for text, names in chains.items() if names & replacements.keys()}
    if not targets:
        return None
    respelled = expression.visit(_Respeller(targets))
    text = cst.Module(body=[]).code_for_node(respelled)
    return string.with_changes(value=f"{string.prefix}{string.quote}{text}{string.quote}")


class _Respeller(cst.CSTTransformer):
    def __init__(self, targets: dict[str, str]) -> None:
        super().__init__()
        self.targets = targets

    def on_visit(self, node: cst.CSTNode) -> bool:
        return not (isinstance(node, (cst.Name, cst.Attribute)) and dotted(node) in self.targets)

    def on_leave(self, original, updated):
        if isinstance(original, (cst.Name, cst.Attribute)) and dotted(original) in self.targets:
            return cst.Name(self.targets[dotted(original)])
        return updated


def _parse(string: cst.SimpleString) -> cst.BaseExpression | None:
    text = string.evaluated_value
    if not isinstance(text, str) or "\n" in text:
        return None
    try:
        return cst.parse_expression(text.strip())
    except cst.ParserSyntaxError:
        return None


def _chains(ctx, expression: cst.BaseExpression | None) -> dict[str, set[str]]:
    """Each outermost dotted name `expression` spells -> the qualified names it resolves to at module level."""
    chains: dict[str, set[str]] = {}
    if expression is not None:
        _collect(ctx, expression, chains)
    return chains


def _collect(ctx, node: cst.CSTNode, chains: dict) -> None:
    text = dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else ""
    if text:
        chains[text] = resolve_spelled(ctx, text)
        return
    for child in children(node):
        _collect(ctx, child, chains)


def resolve_spelled(ctx, text: str) -> set[str]:
    """The qualified names a dotted name spelled in a string (`"FSDP"`, `"fsdp.MixedPrecision"`) stands for at
    module level: its first part resolved as the module's imports bind it."""
    scope = ctx.scope(ctx.module)
    root, _, rest = text.partition(".")
    names = {q.name for q in scope.get_qualified_names_for(root)} if scope is not None else set()
    return {canonical(f"{name}.{rest}" if rest else name) for name in names or {root}}
