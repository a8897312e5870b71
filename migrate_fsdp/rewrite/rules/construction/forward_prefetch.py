"""MF109: `forward_prefetch=True` -> explicit forward prefetching of the next FSDP module.

FSDP1 records the order in which its modules run forward in the first
iteration and, from the second on, prefetches the next module's all-gather
(`_exec_order_utils`, forward_prefetch_limit=1). FSDP2's equivalent is
`FSDPModule.set_modules_to_forward_prefetch` (tutorial, seeds/002); since the
order is only known once the model has run, the rewrite adds a small helper
that records the first forward's order, exactly as FSDP1 did, and then sets
each module to prefetch the next one. A flag known only at run time does so
where it holds.
"""

from migrate_fsdp.rewrite.rules.construction.codegen import statements
from migrate_fsdp.rewrite.rules.construction.flags import flag, guarded
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible

HELPER = "_fsdp1_forward_prefetch"


class ForwardPrefetchRule(KeywordRule):
    code = "MF109"
    name = "forward-prefetch"
    summary = "forward_prefetch=True -> set_modules_to_forward_prefetch in the first forward's order"
    keywords = ("forward_prefetch",)

    def apply(self, argument, plan) -> None:
        value, _ = self.analysis.follow(argument.value, plan)
        enabled = flag(self.analysis, value, plan, "forward_prefetch")  # at run time: prefetch where it holds
        if enabled is None:
            raise Unconvertible(f"forward_prefetch={self.ctx.code(argument.value)} uses other FSDP1 names")
        plan.forward_prefetch = enabled

    def statements(self, plan, module) -> list:
        return guarded(plan.forward_prefetch, statements(f"{self.ctx.add_helper(HELPER)}(MODULE)", MODULE=module))
