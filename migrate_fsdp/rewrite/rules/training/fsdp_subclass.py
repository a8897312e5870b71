"""MF210: a class deriving from FullyShardedDataParallel, and the places that build one.

FSDP2 has no wrapper class to derive from: `fully_shard(module)` changes the
module's own class to a generated `FSDP<Cls>(Cls, FSDPModule)` (the
`fully_shard` docstring in torch/distributed/fsdp/_fully_shard/_fully_shard.py).
What a subclass overrides (forward, state-dict hooks, extra attributes)
must move onto the module class, or into a function run around
`fully_shard`; no mechanical rewrite can choose, so the base is reported.

Each `Sub(module)` builds an FSDP1 wrapper, so it is an FSDP1 constructor
that stays: every place that builds one is reported (that is where
`fully_shard` goes once the overrides have moved), and the program model
keeps its model's uses FSDP1 with it, as for any constructor that cannot
convert (docs/rewrite.md, "One program").
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule
from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS, assignments_of


class FsdpSubclass(TrainingRule):
    code = "MF210"
    name = "fsdp-subclass"
    summary = "class X(FullyShardedDataParallel) and X(...) reported: FSDP2 has no wrapper class to subclass"

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            if self.ctx.matches(base.value, FSDP_CLASS):
                self.ctx.report(
                    base.value,
                    self.code,
                    f"`{node.name.value}` subclasses FSDP1's wrapper, which FSDP2 does not have: `fully_shard(module)` "
                    "turns the module's own class into an FSDPModule; move the overrides onto the module class "
                    "and call `fully_shard` on it",
                )

    def visit_Call(self, node: cst.Call) -> None:
        if not isinstance(node.func, cst.Name):
            return
        assigned = assignments_of(self.ctx.scope(node.func), node.func.value)
        if any(isinstance(a.node, cst.ClassDef) and self._derives_from_fsdp(a.node) for a in assigned):
            # An FSDP1 constructor that stays: the program keeps its model's uses FSDP1 too (analysis/program.py).
            self.ctx.program.constructor(node, converts=False, stack=tuple(self.ctx.stack))
            self.ctx.report(
                node,
                self.code,
                f"`{node.func.value}(...)` builds an FSDP1 wrapper (a subclass of it): it stays FSDP1, and so do its "
                "model's uses; once the subclass's overrides are on the module class, call `fully_shard` on the "
                "module here",
            )

    def _derives_from_fsdp(self, node: cst.ClassDef) -> bool:
        return any(self.ctx.matches(base.value, FSDP_CLASS) for base in node.bases)
