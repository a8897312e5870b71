"""MF212: strings and constants that handle FSDP1's `_fsdp_wrapped_module.` name prefix.

FSDP1 inserts `_fsdp_wrapped_module.` into the names of everything under a
wrapper (and `_flat_param` for flat parameters); code around it strips or
tests those prefixes (`k.replace("_fsdp_wrapped_module.", "")`). FSDP2 wraps
nothing, so names of a live FSDP2 model never carry them and such code
becomes a no-op for the model. It still matters for checkpoints FSDP1 wrote
with those names, which only the user can tell apart, so it is reported, not
removed.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import TrainingRule
from migrate_fsdp.rewrite.rules.training.flat_param_internals import PREFIX_CONSTANTS

_MARKERS = ("_fsdp_wrapped_module", "_flat_param")
_ADVICE = (
    "FSDP2 adds no `_fsdp_wrapped_module.` / `_flat_param` to names, so names from an FSDP2 model need no "
    "stripping; keep this only for names read from FSDP1 checkpoints (or convert those with `migrate-fsdp convert-ckpt`)"
)


class WrappedPrefixStrings(TrainingRule):
    code = "MF212"
    name = "wrapped-prefix-strings"
    summary = "strings handling the _fsdp_wrapped_module. prefix reported: FSDP2 names carry none"

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = node.evaluated_value
        if isinstance(value, bytes) or self._is_docstring():
            return
        self._check(node, value)

    def visit_FormattedStringText(self, node: cst.FormattedStringText) -> None:
        self._check(node, node.value)

    def _check(self, node, text: str) -> None:
        marker = next((m for m in _MARKERS if m in text), None)
        if marker is not None:
            self.ctx.report(node, self.code, f"string with FSDP1's `{marker}` name part; {_ADVICE}")

    def visit_Name(self, node: cst.Name) -> None:
        self._check_constant(node)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._check_constant(node)

    def _check_constant(self, node) -> None:
        if any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in self.ctx.stack):
            return
        names = self.ctx.qualified_names(node) & PREFIX_CONSTANTS
        if names:
            constant = sorted(names)[0].rsplit(".", 1)[1]
            self.ctx.report(node, self.code, f"`{constant}` is FSDP1's name prefix; {_ADVICE}")

    def _is_docstring(self) -> bool:
        stack = self.ctx.stack
        return len(stack) >= 2 and isinstance(stack[-2], cst.Expr)
