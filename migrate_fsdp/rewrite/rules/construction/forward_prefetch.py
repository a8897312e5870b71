"""MF109: `forward_prefetch=True` -> explicit forward prefetching of the next FSDP module.

FSDP1 records the order in which its modules run forward in the first
iteration and, from the second on, prefetches the next module's all-gather
(`_exec_order_utils`, forward_prefetch_limit=1). FSDP2's equivalent is
`FSDPModule.set_modules_to_forward_prefetch` (tutorial, seeds/002); since the
order is only known once the model has run, the rewrite adds a small helper
that records the first forward's order, exactly as FSDP1 did, and then sets
each module to prefetch the next one.
"""

from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible

HELPER = "_fsdp1_forward_prefetch"


class ForwardPrefetchRule(KeywordRule):
    code = "MF109"
    name = "forward-prefetch"
    summary = "forward_prefetch=True -> set_modules_to_forward_prefetch in the first forward's order"
    keywords = ("forward_prefetch",)

    def apply(self, argument, plan) -> None:
        value, _ = self.analysis.follow(argument.value, plan)
        enabled = self.analysis.literal_bool(value)
        if enabled is None:
            raise Unconvertible(
                f"forward_prefetch={self.ctx.code(argument.value)} is known only at run time; with FSDP2 call "
                "set_modules_to_forward_prefetch on each FSDP module (see docs/rules/MF109.md) where it is True"
            )
        plan.forward_prefetch = enabled

    def statements(self, module) -> str:
        return f"{self.ctx.add_helper(HELPER)}(MODULE)"
