"""MF103: `sharding_strategy` -> fully_shard's `reshard_after_forward` and the mesh's shape.

FSDP2 says with a mesh and one flag what FSDP1 said with a strategy (migration
guide, seeds/002; `fully_shard` docstring):

- FULL_SHARD: FSDP2's default. `reshard_after_forward=None` reshards every
  module after forward except the root, which is exactly what FSDP1 does
  (`_post_forward_reshard` never frees the root's parameters).
- SHARD_GRAD_OP: `reshard_after_forward=False`.
- HYBRID_SHARD / _HYBRID_SHARD_ZERO2: a 2-D (replicate, shard) mesh, the
  latter with `reshard_after_forward=False` (the mesh is MF106's).
- NO_SHARD: a `(world, 1)` mesh: replicate over every rank, shard over one.

A strategy known only at run time (a config field, `ShardingStrategy[name]`,
`getattr(ShardingStrategy, name)`, a parameter, a table from the user's
names to members that only this call reads, whose members become their
names) is mapped at run time from the member's name, which also accepts the
name itself, so no FSDP1 name stays in the output.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import string
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Strategy, Unconvertible

SHARDING_STRATEGY = "torch.distributed.fsdp.ShardingStrategy"
MEMBERS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")
HYBRID = ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
NO_RESHARD = ("SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2")


class ShardingStrategyRule(KeywordRule):
    code = "MF103"
    name = "sharding-strategy"
    summary = "sharding_strategy -> reshard_after_forward and the mesh shape"
    keywords = ("sharding_strategy",)
    leftovers = {
        SHARDING_STRATEGY: (
            "ShardingStrategy is FSDP1's; FSDP2 expresses it as fully_shard(reshard_after_forward=...) and the mesh "
            "(FULL_SHARD: defaults, SHARD_GRAD_OP: reshard_after_forward=False, HYBRID_SHARD: 2-D mesh, "
            "NO_SHARD: (world, 1) mesh); see docs/rules/MF103.md"
        )
    }

    def apply(self, argument, plan) -> None:
        value, definition = self.analysis.follow(argument.value, plan)
        if isinstance(value, cst.Name) and value.value == "None":
            return
        member = self.member(value)
        if member is not None:
            plan.strategy = Strategy(member)
            if member in NO_RESHARD:
                plan.kwargs["reshard_after_forward"] = (cst.Name("False"), argument.arg)
            return
        if definition is not None and not self._uses(value) and self._possible(value, plan) is None:
            # A name for something computed elsewhere: read it at run time, where it is.
            self.analysis.unfollow(definition, plan)
            value = argument.value
        written = self._possible(value)  # the call's own table or choice (a named table stays the user's vocabulary)
        if written and written <= {"FULL_SHARD", "SHARD_GRAD_OP"}:
            # Only the reshard flag tells those two apart: the call's own table or choice gives it, no helper needed.
            reshard = self._mapped(value, {"FULL_SHARD": cst.Name("None"), "SHARD_GRAD_OP": cst.Name("False")})
            if written != {"FULL_SHARD"}:
                plan.kwargs["reshard_after_forward"] = (reshard, argument.arg)
            plan.strategy = Strategy("FULL_SHARD", None, written)
            return
        self._tables_by_name(value, plan)
        for assigned in self.analysis.assigned_on_branches(value, plan) or ():
            # `strategy = ShardingStrategy.X` / `if ...: strategy = ...`: each assignment gives the name instead
            named = self._as_names(assigned.value)
            if named is None:
                raise Unconvertible(
                    f"{self.ctx.code(assigned.value)} ({self.ctx.code(value)} at the call) cannot be mapped to FSDP2 "
                    "(it uses other FSDP1 names); assign a ShardingStrategy member or its name",
                    assigned.value,
                )
            if self.ctx.code(named) != self.ctx.code(assigned.value):
                plan.redefined[assigned] = named
        runtime = self._as_names(value)
        if runtime is None:
            raise Unconvertible(
                f"sharding_strategy={self.ctx.code(argument.value)} cannot be mapped to FSDP2 (it uses other FSDP1 "
                "names); pass a ShardingStrategy member, its name, or a variable holding one"
            )
        plan.strategy = Strategy(None, runtime, self._possible(value, plan))

    def _possible(self, node, plan=None) -> frozenset[str] | None:
        """The members `node` picks from at run time when each is written out: a dict of members looked up
        (inline, or with `plan` also a table only this call reads), or a choice between members."""
        if isinstance(node, cst.IfExp):
            body, orelse = self._possible(node.body, plan), self._possible(node.orelse, plan)
            return None if body is None or orelse is None else body | orelse
        member = self.member(node)
        if member is not None:
            return frozenset([member])
        if self.analysis.is_none(node):  # FSDP1's default, which reshard_after_forward=None also is
            return frozenset(["FULL_SHARD"])
        if not isinstance(node, cst.Subscript):
            return None
        table = node.value
        if not isinstance(table, cst.Dict) and plan is not None:
            definition = self.analysis.owned(table, plan)
            table = None if definition is None else definition.value
        if not isinstance(table, cst.Dict) or not table.elements:
            return None
        members = [self.member(e.value) if isinstance(e, cst.DictElement) else None for e in table.elements]
        return None if None in members else frozenset(members)

    def _mapped(self, node, replacements: dict) -> cst.BaseExpression:
        """`node`, a lookup in a dict of members or a choice of members, each member replaced by `replacements[member]`."""
        rule = self

        class _Replace(cst.CSTTransformer):
            def leave_Attribute(self, original, updated):
                member = rule.member(original)
                return updated if member is None else replacements[member]

        return node.visit(_Replace())

    def _tables_by_name(self, node, plan) -> None:
        """`TABLE[key]` where only this call reads TABLE, a dict of ShardingStrategy members: its values become their names.

        The table is the user's vocabulary (`{"full": ShardingStrategy.FULL_SHARD, ...}`); the names are
        what the sharding helper reads, so no FSDP1 object is left to reach FSDP2.
        """
        rule = self

        class _Find(cst.CSTVisitor):
            def visit_Subscript(self, subscript) -> None:
                definition = rule.analysis.owned(subscript.value, plan)
                if definition is None or not isinstance(definition.value, cst.Dict):
                    return
                elements = definition.value.elements
                members = [rule.member(e.value) if isinstance(e, cst.DictElement) else None for e in elements]
                if elements and None not in members:
                    names = [e.with_changes(value=string(m)) for e, m in zip(elements, members)]
                    plan.redefined[definition] = definition.value.with_changes(elements=names)

        node.visit(_Find())

    def member(self, node) -> str | None:
        return strategy_member(self.ctx, node)

    def _uses(self, node) -> list:
        """The ShardingStrategy references in `node`: `ShardingStrategy.X`, and `ShardingStrategy` in `[...]`."""
        rule = self
        found = []

        class _Find(cst.CSTVisitor):
            def visit_Attribute(self, original) -> bool:
                if rule.member(original) is None:
                    return True
                found.append(original)
                return False

            def visit_Subscript(self, original) -> None:
                if rule.ctx.matches(original.value, SHARDING_STRATEGY):
                    found.append(original.value)

            def visit_Call(self, original) -> None:
                if rule._getattr_name(original) is not None:
                    found.append(original.args[0].value)

        node.visit(_Find())
        return found

    def _getattr_name(self, node) -> cst.BaseExpression | None:
        """`name` in `getattr(ShardingStrategy, name)`."""
        if (
            isinstance(node, cst.Call)
            and self.ctx.matches(node.func, "builtins.getattr")
            and len(node.args) == 2
            and not any(arg.star or arg.keyword for arg in node.args)
            and self.ctx.matches(node.args[0].value, SHARDING_STRATEGY)
        ):
            return node.args[1].value
        return None

    def _as_names(self, node):
        """`node` with ShardingStrategy.X -> "X" and ShardingStrategy[e] -> e; None if other FSDP1 names stay."""
        allowed = {id(use) for use in self._uses(node)}
        if any(id(ref) not in allowed for ref in self.analysis.fsdp1_references(node)):
            return None
        rule = self

        class _Replace(cst.CSTTransformer):
            def leave_Attribute(self, original, updated):
                member = rule.member(original)
                return updated if member is None else string(member)

            def leave_Call(self, original, updated):
                name = rule._getattr_name(original)
                return updated if name is None else updated.args[1].value

            def leave_Subscript(self, original, updated):
                if rule.ctx.matches(original.value, SHARDING_STRATEGY) and len(updated.slice) == 1:
                    index = updated.slice[0].slice
                    if isinstance(index, cst.Index):
                        return index.value
                return updated

        return node.visit(_Replace())


def strategy_member(ctx, node) -> str | None:
    """"FULL_SHARD" for `ShardingStrategy.FULL_SHARD`, however spelt; None otherwise."""
    for name in ctx.qualified_names(node):
        head, _, member = name.rpartition(".")
        if head == SHARDING_STRATEGY and member in MEMBERS:
            return member
    return None
