"""MF211: FSDP1 internals: FlatParameter, `_handle`, `_fsdp_wrapped_module`, `_lazy_init`, private modules.

FSDP1 flattens each unit's parameters into one `FlatParameter` managed by a
`FlatParamHandle` (torch/distributed/fsdp/_flat_param.py) and keeps its
state in private attributes and modules (`_runtime_utils`, `_common_utils`,
...). FSDP2 has none of it: each parameter is its own DTensor shard
(`p.to_local()`, `p.full_tensor()`, `p.placements`) and the module is not
wrapped. Code reaching into these internals cannot be translated
mechanically; every such use is reported with the FSDP2 way in.
"""

import libcst as cst

from migrate_fsdp.rewrite.names import FSDP1_EXPORTS, FSDP_PACKAGE, is_fsdp1
from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, TrainingRule, code_of
from migrate_fsdp.rewrite.analysis.models import Kind

# Private attributes of FSDP1 instances (and their handles), reported on FSDP1 models.
_PRIVATE_ATTRIBUTES = frozenset(
    {
        "_handle",
        "_handles",
        "_all_handles",
        "_flat_param",
        "_fsdp_wrapped_module",
        "_lazy_init",
        "_reset_lazy_init",
        "_is_root",
        "_has_params",
        "_use_orig_params",
        "_sync_gradients",
        "_state_dict_type",
        "_state_dict_config",
        "_optim_state_dict_config",
        "_fully_sharded_module_to_handle",
        "_exec_order_data",
        "_unshard",
        "_comm_hook",
        "_device_handle",
        "_fsdp_use_orig_params",
        "_ignored_modules",
        "_ignored_params",
    }
)
# Only FSDP1 spells these: reported on any receiver.
_UNMISTAKABLE = frozenset({"_fsdp_wrapped_module", "_flat_param"})
# Constants that are name prefixes: MF212 reports them.
PREFIX_CONSTANTS = frozenset(
    {
        f"{FSDP_PACKAGE}._common_utils.FSDP_PREFIX",
        f"{FSDP_PACKAGE}._common_utils.FSDP_WRAPPED_MODULE",
        f"{FSDP_PACKAGE}._flat_param.FLAT_PARAM",
        f"{FSDP_PACKAGE}.fully_sharded_data_parallel.FSDP_PREFIX",
        f"{FSDP_PACKAGE}.fully_sharded_data_parallel.FLAT_PARAM",
        f"{FSDP_PACKAGE}.fully_sharded_data_parallel.FSDP_WRAPPED_MODULE",
    }
)
_ADVICE = (
    "FSDP2 has no flat parameters, handles or wrapper internals: each parameter is a DTensor shard "
    "(`p.to_local()`, `p.full_tensor()`, `p.placements`) on the unwrapped module"
)


def internal_name(qualified_names: set[str]) -> str | None:
    """The FSDP1 internal among `qualified_names` (private module, FlatParameter, TrainingState...), if any."""
    for name in sorted(qualified_names):
        if not is_fsdp1(name) or name in PREFIX_CONSTANTS:
            continue
        parts = name[len(FSDP_PACKAGE) + 1 :].split(".")
        if parts[0].startswith("_") or parts[0] == "flat_param":
            return name
        if parts[0] == "fully_sharded_data_parallel" and len(parts) > 1 and parts[1] not in FSDP1_EXPORTS:
            return name
    return None


class FlatParamInternals(TrainingRule):
    code = "MF211"
    name = "flat-param-internals"
    summary = "FlatParameter, _handle, _fsdp_wrapped_module, _lazy_init and other FSDP1 internals reported"
    tokens = (*FSDP2_TOKENS, b"_flat_param", b"FlatParameter")

    def leave_Name(self, original: cst.Name, updated):
        self._check_reference(original)
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated):
        if self._check_reference(original):
            return updated
        name = original.attr.value
        if name not in _PRIVATE_ATTRIBUTES or self._is_module_path(original) or self._in_import():
            return updated
        kind = self.receiver_kind(original)
        if kind is Kind.FSDP or (name in _UNMISTAKABLE and kind is not Kind.DDP and self.ctx.program.may_build_fsdp1()):
            receiver = code_of(self.ctx, original.value)
            self.ctx.report(original, self.code, f"`{receiver}.{name}` is an FSDP1 internal; {_ADVICE}", fsdp1_only=True)
        return updated

    def _check_reference(self, node) -> bool:
        """Report an FSDP1 internal reached by its qualified name (the outermost node of the chain)."""
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return False
        if self._in_import():
            return False
        qualified = self.ctx.qualified_names(node)
        internal = internal_name(qualified) if any(q.startswith(FSDP_PACKAGE) for q in qualified) else None
        if internal is None:
            return False
        self.ctx.report(node, self.code, f"`{internal}` is an FSDP1 internal; {_ADVICE}")
        return True

    def _in_import(self) -> bool:
        return any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in self.ctx.stack)

    def _is_module_path(self, node) -> bool:
        """`torch.distributed.fsdp._flat_param` itself: a module, not an attribute of a model."""
        return any(q.startswith(FSDP_PACKAGE) for q in self.ctx.qualified_names(node))
