"""MF210: a class deriving from FullyShardedDataParallel.

FSDP2 has no wrapper class to derive from: `fully_shard(module)` changes the
module's own class to a generated `FSDP<Cls>(Cls, FSDPModule)` (the
`fully_shard` docstring in torch/distributed/fsdp/_fully_shard/_fully_shard.py).
What a subclass overrides (forward, state-dict hooks, extra attributes)
must move onto the module class, or into a function run around
`fully_shard`; no mechanical rewrite can choose, so the base is reported.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule
from migrate_fsdp.rewrite.rules.training.models import FSDP_CLASS


class FsdpSubclass(TrainingRule):
    code = "MF210"
    name = "fsdp-subclass"
    summary = "class X(FullyShardedDataParallel) reported: FSDP2 has no wrapper class to subclass"

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
