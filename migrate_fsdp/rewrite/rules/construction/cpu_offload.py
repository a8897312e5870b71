"""MF105: `cpu_offload=CPUOffload(offload_params=True)` -> `offload_policy=CPUOffloadPolicy(...)`.

Migration guide (seeds/002): offload_params=False is FSDP2's default (no
argument); offload_params=True is CPUOffloadPolicy(). CPUOffloadPolicy pins
host memory by default, which needs an accelerator, so the rewrite writes
`pin_memory=torch.cuda.is_available()`: pinned on GPU machines as FSDP1 did,
and still runnable on CPU. A value known only at run time, or `True` (which
FSDP1 rejects), is reported.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import call, expression
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible

CPU_OFFLOAD = "torch.distributed.fsdp.CPUOffload"


class CpuOffloadRule(KeywordRule):
    code = "MF105"
    name = "cpu-offload"
    summary = "cpu_offload=CPUOffload(offload_params=True) -> offload_policy=CPUOffloadPolicy()"
    keywords = ("cpu_offload",)
    leftovers = {
        CPU_OFFLOAD: (
            "CPUOffload is FSDP1's; FSDP2 takes fully_shard(offload_policy=CPUOffloadPolicy()) for offload_params=True "
            "and nothing for offload_params=False"
        )
    }

    def apply(self, argument, plan) -> None:
        value, _ = self.analysis.follow(argument.value, plan)
        if self.analysis.is_none(value):
            return
        offload = self._offload_params(value)
        if offload is None:
            shown = self.ctx.code(argument.value)
            if self.analysis.literal_bool(value) is not None:
                raise Unconvertible(
                    f"cpu_offload={shown} is not a CPUOffload (FSDP1 fails on it); for offloading write "
                    "CPUOffload(offload_params=True), i.e. FSDP2's offload_policy=CPUOffloadPolicy()"
                )
            why = "is also used outside FSDP(...) calls" if self.analysis.shared_name(value) else "is known only at run time"
            raise Unconvertible(
                f"cpu_offload={shown} {why}; pass fully_shard "
                "offload_policy=CPUOffloadPolicy() where it offloads parameters, nothing where it does not"
            )
        if offload:
            anchor = plan.site.node
            policy = self.ctx.require_import("torch.distributed.fsdp", "CPUOffloadPolicy")
            available = expression(f"{self.analysis.names.ref(anchor, 'torch.cuda.is_available')}()")
            plan.kwargs["offload_policy"] = (call(policy, pin_memory=available), argument.arg)

    def _offload_params(self, value) -> bool | None:
        """CPUOffload(...)'s offload_params as a literal; None when it is not one."""
        if not (isinstance(value, cst.Call) and self.ctx.matches(value.func, CPU_OFFLOAD)):
            return None
        if not value.args:
            return False
        arg = value.args[0]
        if len(value.args) > 1 or arg.star or (arg.keyword is not None and arg.keyword.value != "offload_params"):
            return None
        return self.analysis.literal_bool(arg.value)
