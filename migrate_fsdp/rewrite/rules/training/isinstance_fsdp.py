"""MF206: the FSDP class as a type -> `FSDPModule`.

`fully_shard(module)` wraps nothing: it swaps the module's class for a new
`FSDP<Cls>` that subclasses both `Cls` and `FSDPModule` (the `fully_shard`
docstring, torch/distributed/fsdp/_fully_shard/_fully_shard.py; the seed
tutorial's `assert isinstance(model, FSDPModule)`). So:

- `isinstance(x, FSDP)` / `issubclass(c, FSDP)`, also inside a tuple of
  classes -> `FSDPModule` in place of FSDP;
- `type(x) is FSDP` / `==` (and `is not` / `!=`) -> `isinstance(x, FSDPModule)`
  (negated): `type(x)` of an FSDP2 module is the generated class, never
  `FSDPModule` itself, so the exact-type test must become an isinstance test;
- annotations (`model: FSDP`, `Optional[FSDP]`, `"FSDP"`) and
  `typing.cast(FSDP, x)` -> `FSDPModule`.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS
from migrate_fsdp.rewrite.forward_refs import in_annotation, respell
from migrate_fsdp.rewrite.rules.training.base import TrainingRule



def fsdp_module_name(ctx) -> str:
    return ctx.require_import("torch.distributed.fsdp", "FSDPModule")


class IsinstanceFsdp(TrainingRule):
    code = "MF206"
    name = "isinstance-fsdp"
    summary = "isinstance(x, FSDP), type(x) is FSDP, issubclass, annotations -> FSDPModule"

    def leave_Name(self, original: cst.Name, updated):
        return self._as_type(original, updated)

    def leave_Attribute(self, original: cst.Attribute, updated):
        return self._as_type(original, updated)

    def _as_type(self, original, updated):
        if not self.ctx.matches(original, FSDP_CLASS) or not self.in_type_position():
            return updated
        if not self.fsdp2_ahead(original):
            return updated
        self.ctx.mark_handled(original)
        return cst.Name(fsdp_module_name(self.ctx))

    def leave_SimpleString(self, original: cst.SimpleString, updated):
        # A string annotation naming the class: keep it pointing at something that exists.
        if not in_annotation(self.ctx.stack):
            return updated
        respelled = respell(self.ctx, original, {FSDP_CLASS: fsdp_module_name(self.ctx)})
        if respelled is None:
            return updated
        self.ctx.mark_handled(original)
        return respelled

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison):
        if len(original.comparisons) != 1:
            return updated
        target = original.comparisons[0]
        operator = target.operator
        if not isinstance(operator, (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual)):
            return updated
        left, right = original.left, target.comparator
        subject = self._type_call_argument(left) if self.ctx.matches(right, FSDP_CLASS) else None
        if subject is None and self.ctx.matches(left, FSDP_CLASS):
            subject = self._type_call_argument(right)
        if subject is None or not self.fsdp2_ahead(original):
            return updated
        updated_subject = self._updated_subject(updated, left is not None and self._type_call_argument(left) is subject)
        self.ctx.mark_handled(original)
        check = cst.Call(
            func=cst.Name("isinstance"),
            args=[
                cst.Arg(updated_subject, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
                cst.Arg(cst.Name(fsdp_module_name(self.ctx))),
            ],
        )
        if isinstance(operator, (cst.IsNot, cst.NotEqual)):
            return cst.UnaryOperation(operator=cst.Not(), expression=check).with_changes(
                lpar=updated.lpar, rpar=updated.rpar
            )
        return check.with_changes(lpar=updated.lpar, rpar=updated.rpar)

    def _type_call_argument(self, node):
        """`x` for `type(x)`."""
        if (
            isinstance(node, cst.Call)
            and self.ctx.matches(node.func, "builtins.type")
            and len(node.args) == 1
            and not node.args[0].keyword
            and not node.args[0].star
        ):
            return node.args[0].value
        return None

    @staticmethod
    def _updated_subject(updated: cst.Comparison, on_left: bool):
        call = updated.left if on_left else updated.comparisons[0].comparator
        return call.args[0].value
