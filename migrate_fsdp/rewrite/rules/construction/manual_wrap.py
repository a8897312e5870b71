"""MF111: `enable_wrap(wrapper_cls=FSDP, ...)` / `wrap(module)`: FSDP1's manual wrapping, reported.

`wrap()` wraps only inside an `enable_wrap` context, with the context's
arguments merged with its own (torch.distributed.fsdp.wrap). Which modules
that reaches depends on the code run under the context, so the rewrite
cannot list them; with FSDP2 call fully_shard on each of those modules
(children first, with the same arguments), then on the root.
"""

from migrate_fsdp.rewrite.analysis.models import MANUAL_WRAP
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule

WRAP = "torch.distributed.fsdp.wrap"
_ADVICE = (
    "FSDP2 has no wrapping context: call fully_shard(module, ...) on each module wrap() was applied to, children "
    "first, then on the root"
)


class ManualWrapRule(KeywordRule):
    code = "MF111"
    name = "manual-wrap"
    summary = "enable_wrap / wrap (FSDP1 manual wrapping context): reported with the fully_shard equivalent"
    leftovers = {f"{WRAP}.enable_wrap": f"enable_wrap is FSDP1's; {_ADVICE}", f"{WRAP}.wrap": f"wrap is FSDP1's; {_ADVICE}"}

    def visit_Call(self, node) -> None:
        if self.ctx.matches(node.func, MANUAL_WRAP):
            # Under an enable_wrap(wrapper_cls=FSDP) context, possibly one out of sight, wrap() builds an FSDP1
            # model, which stays: its uses stay FSDP1 with it (analysis/program.py).
            self.ctx.program.constructor(node, converts=False, stack=tuple(self.ctx.stack))
