"""MF217: `p.data = ...` on an FSDP model's parameters after wrapping: FSDP1's were plain tensors to swap.

Hand-made mixed precision (mistral-finetune's `prepare_mixed_precision`)
casts each parameter's storage after wrapping (`p.data = p.data.to(bf16)`)
and swaps an fp32 copy in around `optimizer.step()` (`p.data = p._mp_param`).
FSDP1's parameters there were this rank's flat shards, plain tensors FSDP1
read back from `p.data` at the next all-gather. FSDP2's are DTensors whose
local shards `fully_shard` keeps for its own all-gathers and optimizer, so
the swap leaves the two apart: the first `optimizer.step()` fails, or the
model trains on storage FSDP2 no longer reads. Reported at the loop; the
model stays FSDP1.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.guards import in_summon
from migrate_fsdp.rewrite.analysis.models import Kind
from migrate_fsdp.rewrite.analysis.parameter_loops import LOOPS, binds, handed_in, parameters_source
from migrate_fsdp.rewrite.rules.training.base import TrainingRule


class ParameterData(TrainingRule):
    code = "MF217"
    name = "parameter-data"
    summary = "`p.data = ...` on an FSDP model's parameters after wrapping: FSDP2 keeps its own shards -> reported, kept FSDP1"
    # A mixed-precision module may name no FSDP: it is handed the parameters, and names each one as loops do (a
    # bare `.data =` would parse every compiler module of a tree).
    tokens = tuple((f"{name}.data{space}=".encode(),) for name in ("p", "param", "parameter") for space in (" ", ""))

    def leave_Assign(self, original: cst.Assign, updated):
        for target in original.targets:
            swapped = target.target
            if isinstance(swapped, cst.Attribute) and swapped.attr.value == "data" and isinstance(swapped.value, cst.Name):
                self._check(swapped.value.value)
        return updated

    def _check(self, name: str) -> None:
        if in_summon(self.ctx, self.ctx.stack):  # FSDP1's full parameters there (MF204)
            return
        loop = next((n for n in reversed(self.ctx.stack) if isinstance(n, LOOPS) and binds(n.target, name)), None)
        if loop is None:
            return
        model = parameters_source(self.ctx, loop.iter)
        whose = f"`{self.ctx.code(model)}`'s parameters" if model is not None else f"the parameters in `{self.ctx.code(loop.iter)}`"
        if model is None and isinstance(loop.iter, cst.Name) and handed_in(self.ctx, loop.iter):
            model = loop.iter  # `for p in params:` of `def prepare(params)`, handed `model.parameters()`
        if model is None:
            return
        known = self.models.is_fsdp_model(model)
        handed = handed_in(self.ctx, model) or _held(model)  # a model of unknown origin built here is not wrapped yet
        if not known and not (handed and self.models.kind(model) is Kind.UNKNOWN and self.ctx.program.may_build_fsdp1()):
            return  # a module shown not to be an FSDP1 model, or one this code builds (cast before wrapping)
        self.ctx.report(
            model,
            self.code,
            f"`{name}.data = ...` replaces the storage of {whose} after wrapping: FSDP1's "
            "were plain flat shards, FSDP2's are DTensors whose local shards fully_shard keeps for its all-gathers; "
            "kept FSDP1",
            fsdp1_only=not known,  # parameters handed in: the models that may reach them stay with them
        )


def _held(model) -> bool:
    """`self.model`: a model held on an object, set elsewhere."""
    return isinstance(model, cst.Attribute) and isinstance(model.value, cst.Name) and model.value.value == "self"
