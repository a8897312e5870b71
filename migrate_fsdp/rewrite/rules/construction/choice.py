"""Keyword values chosen at run time (`A if cond else B`), converted branch by branch.

Real FSDP1 code picks its settings with conditional expressions
(`mixed_precision=mp if not cfg.pure_bf16 else None`,
`CPUOffload(offload_params=cfg.offload)`). Each branch is an FSDP1 value that
converts on its own; the FSDP2 value is the same choice over the converted
branches, so the condition stays the user's and is evaluated where the FSDP2
value is built.
"""

from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import disjunction, parenthesized

@dataclass(frozen=True, eq=False)
class Choice:
    """`then if test else orelse`; the branches are leaves or Choices. `node` is the source's if-expression, if any."""

    test: cst.BaseExpression
    then: object
    orelse: object
    node: cst.IfExp | None = None


def resolve(value: cst.BaseExpression, leaf: Callable, follow: Callable) -> object:
    """`leaf(branch, source)` for every branch of the if-expressions in `value`, as a tree of Choices.

    `follow(node)` gives the value a name stands for (or the node itself),
    `source` is the branch as written (the name); `leaf` may itself return a
    Choice (a flag known only at run time).
    """
    followed = follow(value)
    if isinstance(followed, cst.IfExp):
        return Choice(followed.test, resolve(followed.body, leaf, follow), resolve(followed.orelse, leaf, follow), followed)
    return leaf(followed, value)


def leaves(tree) -> list:
    if isinstance(tree, Choice):
        return [*leaves(tree.then), *leaves(tree.orelse)]
    return [tree]


def join(tree, build: Callable) -> cst.BaseExpression | None:
    """The FSDP2 expression for `tree`: `build(leaf)` in each branch, one expression where all branches agree.

    `build` returns None for a branch whose value does not matter (any other
    branch's will do); None comes back only when no branch matters.
    """
    built = _built(tree, build)
    known = [node for node in leaves(built) if node is not None]
    if not known:
        return None
    return _expression(built, known[0])


def _built(tree, build):
    if isinstance(tree, Choice):
        return Choice(tree.test, _built(tree.then, build), _built(tree.orelse, build), tree.node)
    return build(tree)


def _expression(tree, fallback) -> cst.BaseExpression:
    if not isinstance(tree, Choice):
        return fallback if tree is None else tree
    then, orelse = _expression(tree.then, fallback), _expression(tree.orelse, fallback)
    if _code(then) == _code(orelse):
        return then
    then, test, node = parenthesized(then), tree.test, tree.node
    if isinstance(orelse, cst.IfExp) and not orelse.lpar and _code(orelse.body) == _code(then):
        # `A if t else A if u else B`: `A if t or u else B`
        test, orelse, node = disjunction([test, orelse.test]), orelse.orelse, None
    orelse = parenthesized(orelse, cst.NamedExpr)
    if node is not None:
        return node.with_changes(body=then, orelse=orelse)
    return cst.IfExp(test=parenthesized(test), body=then, orelse=orelse)


def _code(node) -> str:
    return cst.Module([]).code_for_node(node)
