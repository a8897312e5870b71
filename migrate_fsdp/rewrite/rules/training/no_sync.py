"""MF201: `model.no_sync()` -> a context manager over FSDP2's `set_requires_gradient_sync`.

FSDP2 has no `no_sync()`; the migration guide maps it to
`set_requires_gradient_sync` (/work/shared/seeds/002, "no_sync():
set_requires_gradient_sync"; `FSDPModule.set_requires_gradient_sync` in
torch/distributed/fsdp/_fully_shard/_fully_shard.py). That is a setter, not a
context manager: FSDP1's `no_sync()` (fully_sharded_data_parallel.py) saves
each module's flag and restores it on exit, exceptions included, so a nested
`no_sync()` leaves sync off for the enclosing block. The rewrite calls a small
torch-only context manager added to the file, which does the same; every form
then stays one expression: the `with` block, `model.no_sync() if c else
nullcontext()`, `ExitStack.enter_context(model.no_sync())`, and the bound
method stored for later (`functools.partial` of the helper).

Only FSDP1 models are touched: DDP's `no_sync()` is left alone. A receiver
whose type the file does not show (a loop shared by DDP and FSDP runs) gets the
helper too, which calls any other module's own `no_sync()`, unless no FSDP1
model that converts may reach the file; then it is reported (in a file that
imports DDP but not FSDP1 it is presumed DDP's).
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, TrainingRule, code_of
from migrate_fsdp.rewrite.analysis.models import Kind


HELPER_NAME = "fsdp2_no_sync"


class NoSync(TrainingRule):
    code = "MF201"
    name = "no-sync"
    summary = "model.no_sync() -> set_requires_gradient_sync(False), previous setting restored on exit"
    # `.no_sync(` on a model built in another file: parse the file to report it.
    tokens = (*FSDP2_TOKENS, b".no_sync(")

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if self.fsdp_method(func) == "no_sync":  # FSDP.no_sync(model)
            single = len(original.args) == 1 and not original.args[0].keyword and not original.args[0].star
            if single and self.fsdp2_ahead(original):
                self.ctx.mark_handled(func)
                return cst.Call(func=cst.Name(self._helper()), args=[updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
            if not single:
                self.ctx.report(original, self.code, self._advice("FSDP.no_sync"))
            return updated
        if self.model_method(func, "no_sync") is None or original.args:
            return updated  # e.g. accelerate's accelerator.no_sync(model)
        if self._convert(func):
            return cst.Call(func=cst.Name(self._helper()), args=[cst.Arg(updated.func.value)])
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if original.attr.value != "no_sync" or self.fsdp_method(original):
            return updated
        parent = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        if isinstance(parent, cst.Call) and parent.func is original:
            return updated  # a call: leave_Call decides
        if self._convert(original):
            # A bound method kept for later (`ctx = model.no_sync if ... else nullcontext`).
            partial = self.ctx.require_import("functools", "partial")
            return cst.Call(
                func=cst.Name(partial),
                args=[cst.Arg(cst.Name(self._helper()), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))), cst.Arg(updated.value)],
            )
        return updated

    def _convert(self, func: cst.Attribute) -> bool:
        kind = self.model_method_receiver_kind(func)
        if kind is Kind.FSDP:
            return self.fsdp2_ahead(func)
        if kind is not Kind.UNKNOWN or not self.ctx.program.may_build_fsdp1():
            return False
        if not self.ctx.dual_versions.holds(self.ctx.stack) and self.ctx.program.dispatch(func):
            return True  # the helper calls any other module's own no_sync(): DDP's, an FSDP1 model's
        if not self.models.file_may_hold_ddp:
            receiver = code_of(self.ctx, func.value)
            self.ctx.report(
                func,
                self.code,
                f"cannot tell whether `{receiver}` is an FSDP1 model (DDP has `no_sync` too); "
                + self._advice(f"{receiver}.no_sync"),
                unsure=True,
            )
        return False

    @staticmethod
    def _advice(what: str) -> str:
        return (
            f"for an FSDP1 model replace `{what}()` with `set_requires_gradient_sync(False)` "
            "and restore the previous setting after the block (FSDP2)"
        )

    def _helper(self) -> str:
        return self.ctx.add_helper(HELPER_NAME)
