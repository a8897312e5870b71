"""MF216: an FSDP model's parameters or gradients summed and all-reduced by hand: FSDP1 gave each rank its shard.

Outside forward, FSDP1 showed `p` and `p.grad` of `model.parameters()` as this
rank's shard (of a flat parameter, or a view of one), so the usual logging
code summed their squares and `dist.all_reduce`d the sum to get the global
norm. FSDP2's are DTensors: adding one to a plain tensor fails, all_reduce
takes none, and a sum over DTensors is already global, so the all-reduce
would count it once per rank. Such a function (a loop or comprehension over
the parameters reading their values, and an all-reduce) keeps its model
FSDP1, reported at the loop; with FSDP2, sum `p.to_local()` /
`p.grad.to_local()`, or take `torch.nn.utils.get_total_norm`.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.parameter_loops import handed_in, loop_target, parameters_of, per_item
from migrate_fsdp.rewrite.rules.training.base import TrainingRule
from migrate_fsdp.rewrite.syntax import walk

_ALL_REDUCE = ("torch.distributed.all_reduce", "torch.distributed.distributed_c10d.all_reduce")
# What a parameter answers the same from a shard or a DTensor, or that reads no value.
_NOT_VALUES = frozenset(
    {"shape", "ndim", "dim", "size", "numel", "nelement", "dtype", "device", "requires_grad", "is_leaf", "name"}
)


class ShardSums(TrainingRule):
    code = "MF216"
    name = "shard-sums"
    summary = "an FSDP model's parameters or gradients summed and all-reduced by hand: FSDP1's were shards, kept FSDP1"
    # Gradient-norm helpers live in modules that may name no FSDP (a metrics module).
    tokens = ((b"parameters(", b"all_reduce"),)

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._reducing: dict[int, bool] = {}  # id(function or module) -> it calls all_reduce

    def leave_For(self, original: cst.For, updated):
        self._check(original, [original.body])
        return updated

    def leave_CompFor(self, original: cst.CompFor, updated):
        comprehension = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        if isinstance(comprehension, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            self._check(original, per_item(comprehension, original))
        return updated

    def _check(self, loop, scopes: list) -> None:
        model = parameters_of(self.ctx, loop.iter)
        target = loop_target(loop)
        if model is None or target is None or not self._all_reduces() or not _reads_values(scopes, target):
            return
        known = self.models.is_fsdp_model(model)
        if not known and not (handed_in(self.ctx, model) and self.ctx.program.may_build_fsdp1()):
            return
        self.ctx.report(
            model,
            self.code,
            f"`{self.ctx.code(model)}`'s parameters summed here and all-reduced by hand: FSDP1 gave each rank its "
            "shard, FSDP2 gives DTensors (whose sums are global already); kept FSDP1. With FSDP2 sum "
            "`p.to_local()` / `p.grad.to_local()` before the all-reduce",
            fsdp1_only=not known,  # a model handed in: the ones its callers give stay with it
        )

    def _all_reduces(self) -> bool:
        """The function around (or the module) calls `dist.all_reduce`."""
        around = next((n for n in reversed(self.ctx.stack) if isinstance(n, (cst.FunctionDef, cst.Module))), None)
        if around is None:
            return False
        if id(around) not in self._reducing:
            self._reducing[id(around)] = any(
                isinstance(node, cst.Call) and self.ctx.matches(node.func, *_ALL_REDUCE) for node, _ in walk(around)
            )
        return self._reducing[id(around)]


def _reads_values(scopes: list, target: str) -> bool:
    """The loop reads the values of parameter `target` or of its gradient, not only its size or whether it has one."""
    for node, parents in walk(*scopes):
        if not (isinstance(node, cst.Name) and node.value == target):
            continue
        parent = parents[-1] if parents else None
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value in _NOT_VALUES:
                continue
            above = parents[-2] if len(parents) >= 2 else None
            if parent.attr.value == "grad" and isinstance(above, (cst.Comparison, cst.ComparisonTarget)):
                continue  # `p.grad is not None`
        return True
    return False
