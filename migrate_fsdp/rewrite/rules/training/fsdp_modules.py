"""MF207: `FSDP.fsdp_modules(model)` -> the FSDP2 modules of `model`, by `isinstance(m, FSDPModule)`.

FSDP1 lists its instances in `model.modules()` order (`_get_fsdp_states`,
torch/distributed/fsdp/_traversal_utils.py); FSDP2 has no such function, but
every sharded module is an `FSDPModule` (see MF206), so the same list is a
comprehension over `model.modules()`. `root_only=True` (the outermost FSDP
modules) becomes a small helper that stops descending at the first
`FSDPModule` on each branch, which is what FSDP1's lazy-init root marking
yields.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule, bind, from_template, literal_bool
from migrate_fsdp.rewrite.rules.training.isinstance_fsdp import fsdp_module_name
from migrate_fsdp.rewrite.analysis.models import ROOT_MODULES_HELPER


HELPER_NAME = ROOT_MODULES_HELPER
_ADVICE = "use `[m for m in model.modules() if isinstance(m, FSDPModule)]` (FSDP2)"


class FsdpModules(TrainingRule):
    code = "MF207"
    name = "fsdp-modules"
    summary = "FSDP.fsdp_modules(model) -> [m for m in model.modules() if isinstance(m, FSDPModule)]"

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if self.fsdp_method(original.func) != "fsdp_modules":
            return updated
        bound = bind(original, ("module", "root_only"))
        root_only = literal_bool(bound["root_only"].value) if bound and "root_only" in bound else False
        if bound is None or "module" not in bound or root_only is None:
            problem = "`root_only` is not True/False" if bound and "module" in bound else "arguments not understood"
            self.ctx.report(original, self.code, f"{problem}; {_ADVICE}")
            return updated
        parent = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        if isinstance(parent, cst.Return):  # callers may read FSDP1 attributes of the modules (`.params`), out of sight
            self.ctx.report(original, self.code, "`FSDP.fsdp_modules` returned to callers: " + _ADVICE)
            return updated
        if not self.fsdp2_ahead(original):
            return updated
        self.ctx.mark_handled(original.func)
        model = updated.args[original.args.index(bound["module"])].value
        fsdp_module = fsdp_module_name(self.ctx)
        if root_only:
            helper = self.ctx.add_helper(HELPER_NAME)
            return cst.Call(func=cst.Name(helper), args=[cst.Arg(model)])
        return from_template(f"[module for module in MODEL.modules() if isinstance(module, {fsdp_module})]", MODEL=model)

    def leave_Attribute(self, original: cst.Attribute, updated):
        parent = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        if self.fsdp_method(original) == "fsdp_modules" and not (isinstance(parent, cst.Call) and parent.func is original):
            self.ctx.report(original, self.code, "`FSDP.fsdp_modules` passed around: " + _ADVICE)
        return updated

