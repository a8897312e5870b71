"""MF214: an FSDP model's parameters read under no_grad (an EMA update, a teacher) get `fsdp2_reshard(model)` first.

FSDP1 put every module back on its sharded parameters after each forward
(`_post_forward_reshard` -> `handle.reshard`, even for the root and for
SHARD_GRAD_OP). FSDP2 does not reshard the root after forward, nor modules
sharded with reshard_after_forward=False, until a backward runs
(_fsdp_state.py, "For the root, do not reshard after forward"). A model that
only runs under no_grad never runs one, so its `parameters()` are the
unsharded plain tensors: the usual EMA update
`for ps, pt in zip(student.parameters(), teacher.parameters()): pt.mul_(m).add_(ps)`
fails mixing Tensor and DTensor, or, where both sides are unsharded, writes
into buffers the next reshard drops. Before a statement under `torch.no_grad()`
(or `inference_mode`, as a block or a decorator) that reads an FSDP model's
parameters, or before a loop over them whose body turns grad off for its
update, the rewrite reshards that model, as FSDP1 had.

Nothing of FSDP1 is named here: where a model known to be FSDP1's stays
FSDP1 the statement stays as it is, unreported. A module of unknown origin
(a helper's parameter, `self.teacher[k]` in a module naming no FSDP) is
resharded wherever an FSDP1 model that converts may reach it: that does
nothing to a module holding no FSDP2 module. A program whose models all stay
FSDP1 gets no FSDP2 code at all.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import PARAMETER_READS
from migrate_fsdp.rewrite.reshard import reshard_before
from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, TrainingRule
from migrate_fsdp.rewrite.syntax import walk

_NO_GRAD = ("torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad", "torch.autograd.grad_mode.inference_mode")
_GRAD_OFF = (b"no_grad", b"inference_mode")


class ParametersAfterForward(TrainingRule):
    code = "MF214"
    name = "parameters-after-forward"
    summary = "an FSDP model's parameters read under no_grad: fsdp2_reshard(model) first (FSDP1 resharded after forward)"
    # EMA updates live in modules that may name no FSDP (dinov2's ssl_meta_arch.py): under no_grad, they multiply
    # parameters in place.
    tokens = (
        *FSDP2_TOKENS,
        *((grad, b"parameters(", update) for grad in _GRAD_OFF for update in (b"mul_(", b"lerp_(")),
    )

    def leave_Call(self, original: cst.Call, updated):
        func = original.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in PARAMETER_READS and not self.fsdp_method(func)):
            return updated
        model = func.value
        stack = tuple(self.ctx.stack)
        region = self._under_no_grad() or self._loop_under_no_grad()
        if region is None or not self.ctx.can_insert_statements():
            return updated
        # the update may follow the read in the same no_grad block (dinov2 collects both models' parameters into
        # lists, then `torch._foreach_mul_(teacher_params, m)`)
        if not (_updates_in_place(self.ctx.statement()) or _updates_in_place(region)):
            return updated
        known = self.models.is_fsdp_model(model) or self.models.holder_origins(model, stack) is not None
        if known and self.ctx.program.use(original, self.code, stack) is not None:
            return updated  # the model stays FSDP1 (or may be FSDP2 already): nothing changes here
        if not known and not (self.ctx.program.may_build_fsdp1() and self.ctx.program.dispatch(original.func)):
            return updated  # a module of unknown origin (`self.teacher[k]`) is resharded where an FSDP1 model that
            # converts may reach it: that is a no-op where it holds no FSDP2 module, so it needs no verdict
        reshard_before(self.ctx, updated.func.value if isinstance(updated.func, cst.Attribute) else model)
        return updated

    def _under_no_grad(self) -> cst.CSTNode | None:
        """The innermost `with torch.no_grad():` block (or function decorated so) holding the node visited."""
        for node in reversed(self.ctx.stack):
            if isinstance(node, cst.With) and any(self._no_grad(item.item) for item in node.items):
                return node
            if isinstance(node, cst.FunctionDef) and any(self._no_grad(d.decorator) for d in node.decorators):
                return node
        return None

    def _loop_under_no_grad(self) -> cst.CSTNode | None:
        """The `for` loop whose iterable holds the node visited, when its body turns grad off for its update
        (`for pe, pm in zip(ema.parameters(), model.parameters()): with torch.no_grad(): pe.copy_(...)`)."""
        stack = self.ctx.stack
        for index in range(len(stack) - 2, -1, -1):
            node = stack[index]
            if isinstance(node, cst.For):
                if stack[index + 1] is not node.iter:
                    return None
                grad_off = any(
                    isinstance(inner, cst.With) and any(self._no_grad(item.item) for item in inner.items)
                    for inner, _ in walk(node.body)
                )
                return node if grad_off else None
            if isinstance(node, (cst.BaseStatement, cst.BaseSmallStatement, cst.Lambda, cst.CompFor)):
                return None
        return None

    def _no_grad(self, expression) -> bool:
        target = expression.func if isinstance(expression, cst.Call) else expression
        return self.ctx.matches(target, *_NO_GRAD)


def _updates_in_place(statement) -> bool:
    """`statement` changes tensors in place (`p.mul_(m)`, `torch._foreach_lerp_(...)`), as an EMA update does: a
    read alone (a count, a norm) gives the same numbers from FSDP2's unsharded parameters."""
    for node, _ in walk(statement):
        if isinstance(node, cst.Call) and isinstance(node.func, (cst.Attribute, cst.Name)):
            name = node.func.attr.value if isinstance(node.func, cst.Attribute) else node.func.value
            if name.endswith("_") and not name.endswith("__") and (not name.startswith("_") or name.startswith("_foreach_")):
                return True
    return False

