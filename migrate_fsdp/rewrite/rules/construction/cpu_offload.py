"""MF105: `cpu_offload=CPUOffload(offload_params=True)` -> `offload_policy=CPUOffloadPolicy(...)`.

Migration guide (seeds/002): offload_params=False is FSDP2's default (no
argument); offload_params=True is CPUOffloadPolicy(). CPUOffloadPolicy pins
host memory by default, which needs an accelerator, so the rewrite writes
`pin_memory=torch.cuda.is_available()`: pinned on GPU machines as FSDP1 did,
and still runnable on CPU. A choice made at run time (`CPUOffload(...) if
cfg.offload else None`, `CPUOffload(offload_params=cfg.offload)`) stays one:
`CPUOffloadPolicy(...) if cfg.offload else OffloadPolicy()`, the latter being
FSDP2's default (no offloading). A CPUOffload object known only at run time
(a parameter, a config attribute, a variable also used elsewhere) is read
where the call runs: `CPUOffloadPolicy(...) if offload is not None and
offload.offload_params else OffloadPolicy()`. `True` itself (which FSDP1
rejects) is reported.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.construction import choice
from migrate_fsdp.rewrite.rules.construction.codegen import call, expression
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible
from migrate_fsdp.rewrite.syntax import dotted

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
        leaf = lambda value, source: self._branch(value, source, argument)
        definitions = self.analysis.assigned_on_branches(argument.value, plan)
        if definitions is not None:  # set on several branches: each assignment becomes its policy where it stands
            trees = {definition: choice.resolve(definition.value, leaf, lambda node: node) for definition in definitions}
            if not any(offload for tree in trees.values() for offload in choice.leaves(tree)):
                return
            for definition, tree in trees.items():
                plan.redefined[definition] = self._policy(tree, plan)
            plan.kwargs["offload_policy"] = (argument.value, argument.arg)
            return
        tree = choice.resolve(argument.value, leaf, lambda node: self.analysis.follow(node, plan)[0])
        if any(choice.leaves(tree)):
            plan.kwargs["offload_policy"] = (self._policy(tree, plan), argument.arg)

    def _policy(self, tree, plan) -> cst.BaseExpression:
        """CPUOffloadPolicy where `tree` offloads, OffloadPolicy() (FSDP2's default) where it does not."""
        available = expression(f"{self.analysis.names.ref(plan.site.node, 'torch.cuda.is_available')}()")
        offloading = call(self.ctx.require_import("torch.distributed.fsdp", "CPUOffloadPolicy"), pin_memory=available)
        return choice.join(tree, lambda offload: offloading if offload else call(self.ctx.require_import("torch.distributed.fsdp", "OffloadPolicy")))

    def _branch(self, value, source, argument):
        """Whether one possible value offloads parameters: a bool, or a Choice on a flag known only at run time."""
        if self.analysis.is_none(value):
            return False
        offload = self._offload_params(value)
        if offload is not None:
            return offload if isinstance(offload, bool) else choice.Choice(offload, True, False)
        shown = self.ctx.code(source)
        where = None if source is argument.value else source
        if self.analysis.literal_bool(value) is not None:
            raise Unconvertible(
                f"cpu_offload={shown} is not a CPUOffload (FSDP1 fails on it); for offloading write "
                "CPUOffload(offload_params=True), i.e. FSDP2's offload_policy=CPUOffloadPolicy()",
                where,
            )
        if dotted(value) and not self.analysis.fsdp1_references(value):
            # A CPUOffload (or None) known only at run time: its public field decides, where the call runs.
            code = self.ctx.code(value)
            return choice.Choice(expression(f"{code} is not None and {code}.offload_params"), True, False)
        why = "is also used outside FSDP(...) calls" if self.analysis.shared_name(value) else "is known only at run time"
        raise Unconvertible(
            f"cpu_offload={shown} {why}; pass fully_shard "
            "offload_policy=CPUOffloadPolicy() where it offloads parameters, nothing where it does not",
            where,
        )

    def _offload_params(self, value):
        """CPUOffload(...)'s offload_params: a literal bool, the expression of a flag, or None when it is not a CPUOffload."""
        if not (isinstance(value, cst.Call) and self.ctx.matches(value.func, CPU_OFFLOAD)):
            return None
        if not value.args:
            return False
        arg = value.args[0]
        if len(value.args) > 1 or arg.star or (arg.keyword is not None and arg.keyword.value != "offload_params"):
            return None
        literal = self.analysis.literal_bool(arg.value)
        if literal is not None:
            return literal
        if self.analysis.fsdp1_references(arg.value):
            return None
        return arg.value
