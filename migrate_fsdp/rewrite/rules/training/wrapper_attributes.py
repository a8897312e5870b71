"""MF209: attributes of the FSDP1 wrapper that an FSDP2 model does not have.

`fully_shard` shards a module in place and adds only the `FSDPModule`
methods (torch/distributed/fsdp/_fully_shard/_fully_shard.py); the wrapper's
own surface (fully_sharded_data_parallel.py: `module`, `check_is_root`,
`register_comm_hook`, `apply` with its full-parameter gathering, and the
state it keeps in `_FSDPState`: `process_group`, `sharding_strategy`,
`params`, `training_state`, ...) is gone. Each use on an FSDP1 model gets
this code and the FSDP2 way to get the same thing; `model.module.<attribute
of the user's class>` is the model's own under FSDP2 and is rewritten so
(with its constructor). Attributes DDP or plain
modules share (`module`, `apply`, `rank`, `process_group`) are only reported
on receivers the file shows to be FSDP1 models; the others only FSDP1 has
(`check_is_root`, `sharding_strategy`, `mixed_precision`, ...), so they are
reported on a receiver nothing is known of but its name (`model`,
`self.fsdp_model`; not `cfg`, whose fields share these names) in a program
that builds FSDP1 models, and hold back the models that may reach them.
"""

import re

import libcst as cst

from migrate_fsdp.rewrite.rules.training.base import FSDP2_TOKENS, RemovesStatements, code_of
from migrate_fsdp.rewrite.analysis.models import Kind
from migrate_fsdp.rewrite.syntax import dotted, walk

_ADVICE = {
    "module": "FSDP2 wraps nothing: use the model itself (`fully_shard` shards it in place)",
    "check_is_root": "FSDP2 has no root check: the root is the outermost module `fully_shard` was applied to",
    "process_group": "use the device mesh given to `fully_shard` (`mesh.get_group()`)",
    "sharding_strategy": "FSDP2 has none: the strategy is the `reshard_after_forward` and mesh given to `fully_shard`",
    "params": "FSDP1's flat parameters are gone: use `model.parameters()` (sharded DTensors)",
    "training_state": "FSDP2 exposes no training state",
    "compute_device": "use the device of the parameters (`next(model.parameters()).device`) or the mesh's device type",
    "mixed_precision": "it is the `mp_policy` given to `fully_shard`",
    "cpu_offload": "it is the `offload_policy` given to `fully_shard`",
    "backward_prefetch": "FSDP2 always prefetches the next all-gather in backward; tune it with `set_modules_to_backward_prefetch`",
    "forward_prefetch": "tune forward prefetching with `set_modules_to_forward_prefetch`",
    "limit_all_gathers": "FSDP2 needs no all-gather rate limiter",
    "rank": "use `torch.distributed.get_rank()` (or the mesh's `get_local_rank()`)",
    "world_size": "use `torch.distributed.get_world_size()` (or `mesh.size()`)",
    "register_comm_hook": "FSDP2 has no communication hooks: see `set_all_reduce_hook`, `set_gradient_divide_factor` and `set_custom_reduce_scatter`",
    "apply": "FSDP1 gathered full parameters around `apply(fn)`; on FSDP2 `fn` sees sharded DTensors: initialise before `fully_shard`, or make `fn` work on DTensors",
}
PROCESS_GROUP_HELPER = "fsdp2_process_group"
# A receiver of unknown origin named as a model (`model`, `self.fsdp_model`, `net`): configs share these
# attributes' names (`cfg.sharding_strategy`, `train_config.mixed_precision`).
_MODEL_NAME = re.compile(r"(^|_)(model|module|net|network|wrapper|wrapped)s?$")  # not `model_cfg`
_FSDP1_ONLY = frozenset({"check_is_root"})  # reported on any receiver: no other class names it
# What plain modules, DDP or a user's model classes have too: reported only on receivers shown to be FSDP1 models.
_SHARED = frozenset({"module", "apply", "rank", "world_size", "process_group", "register_comm_hook", "params"})
_GROUP_SIZES = {"rank": "get_rank", "world_size": "get_world_size"}
# nn.Module API whose answer differs between FSDP1's inner module and an FSDP2 model (full vs sharded, names).
_MODULE_STATE_API = frozenset(
    {"state_dict", "load_state_dict", "parameters", "buffers", "modules", "children", "apply", "forward",
     "get_parameter", "get_buffer", "get_submodule", "to_empty"}
)
_CHANGED = frozenset({"apply"})  # nn.Module has it too, without FSDP1's gathering


def _users_own(attr: str) -> bool:
    """An attribute of the user's model class, not nn.Module's enumeration or state API."""
    return attr not in _MODULE_STATE_API and not attr.startswith(("register_", "named_", "_"))


class WrapperAttributes(RemovesStatements):
    code = "MF209"
    name = "wrapper-attributes"
    summary = "model.module -> model; other FSDP1 wrapper attributes (process_group, sharding_strategy, ...) reported with FSDP2 advice"
    tokens = (*FSDP2_TOKENS, b"check_is_root")

    def leave_Attribute(self, original: cst.Attribute, updated):
        name = original.attr.value
        if name not in _ADVICE:
            return updated
        if self.fsdp_method(original):  # FSDP.check_is_root(model), FSDP.apply(model, fn)
            what = "works differently" if name in _CHANGED else "does not exist"
            self.ctx.report(original, self.code, f"`FSDP.{name}` {what} in FSDP2; {_ADVICE[name]}")
            return updated
        kind = self.receiver_kind(original)
        if name == "module" and kind is Kind.FSDP and self._unwrapping(original) is not None:
            # `m.module if isinstance(m, FSDP) else m`, `if isinstance(m, FSDP): return m.module`: the user's
            # module, which under FSDP2 is the model itself
            return updated.value if self.fsdp2_ahead(original) else updated
        if name == "module" and kind is Kind.FSDP and (self._reaches_the_users_own(original) or self._named_for_its_own(original)):
            # FSDP1's root wrapped the module; fully_shard shards the module itself: `model.module.freeze()` is
            # `model.freeze()`. What nn.Module enumerates or serialises (state_dict, parameters, ...) differs
            # between the inner module and an FSDP2 model, so `model.module.state_dict()` stays reported.
            return updated.value if self.fsdp2_ahead(original) else updated
        if name in _GROUP_SIZES and kind is Kind.FSDP and self._read(original) and not self.ctx.program.part_of_world():
            # FSDP1's rank and size in the group the model is sharded over: the world's, where every model of the
            # program is sharded over all ranks (no group, mesh, HYBRID_SHARD or NO_SHARD of the user's)
            if self.fsdp2_ahead(original):
                return cst.Call(func=cst.Name(self.ctx.require_import("torch.distributed", _GROUP_SIZES[name])))
            return updated
        if name == "process_group" and self._read(original) and (kind is Kind.FSDP or self._named_as_a_model(original)):
            converted = self._process_group(original, updated, kind)
            if converted is not None:
                return converted
        unknown = (
            kind is Kind.UNKNOWN
            and name not in _SHARED
            and (name in _FSDP1_ONLY or self._named_as_a_model(original))
            and self.ctx.program.may_build_fsdp1()
        )
        if kind is Kind.FSDP or unknown:
            receiver = code_of(self.ctx, original.value)
            what = "works differently" if name in _CHANGED else "does not exist"
            # on a receiver nothing is known of, FSDP1's attribute (`model.process_group` of a checkpointer handed
            # the model) holds back the models that may reach it
            self.ctx.report(
                original, self.code, f"`{receiver}.{name}` {what} on an FSDP2 model; {_ADVICE[name]}", unsure=kind is not Kind.FSDP
            )
        return updated

    def _named_as_a_model(self, node: cst.Attribute) -> bool:
        return _MODEL_NAME.search(code_of(self.ctx, node.value).rsplit(".", 1)[-1].lower()) is not None

    def _process_group(self, original: cst.Attribute, updated, kind: Kind):
        """`model.process_group` -> `fsdp2_process_group(model)`, the group FSDP1 sharded over read from the FSDP2
        model's mesh, and any other module's own: on a model of unknown origin (a checkpointer's argument) where the
        program may hand it a converting model; None where it is left as it is."""
        program = self.ctx.program
        if kind is Kind.FSDP:
            if not self.fsdp2_ahead(original):
                return None
        elif not program.may_build_fsdp1() or self.ctx.dual_versions.holds(self.ctx.stack):
            return None
        else:
            program.use(original, self.code, tuple(self.ctx.stack), dispatchable=True)
            if not program.dispatch(original):
                return None
        self.ctx.mark_handled(original)
        return cst.Call(func=cst.Name(self.ctx.add_helper(PROCESS_GROUP_HELPER)), args=[cst.Arg(updated.value)])

    def _read(self, node) -> bool:
        """`node` is read, not assigned or deleted."""
        parent = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        return not isinstance(parent, (cst.AssignTarget, cst.AugAssign, cst.Del)) or getattr(parent, "target", None) is not node

    def leave_IfExp(self, original: cst.IfExp, updated):
        """`m if isinstance(m, FSDP) else m`, once its `m.module` became `m`: `m`."""
        subject = dotted(original.orelse)
        if subject and self._unwraps(original.test, subject) and dotted(updated.body) == subject == dotted(updated.orelse):
            return updated.orelse
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        """`m = m` left by an unwrapping (`m = m.module if isinstance(m, FSDP) else m`, `m = m.module` under
        `if isinstance(m, FSDP):`) goes."""
        (small, *rest) = updated.body
        if not rest and isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = dotted(small.targets[0].target)
            was = original.body[0].value if isinstance(original.body[0], cst.Assign) else None
            if target and target == dotted(small.value) and target != dotted(was):
                return self.remove_statement(original)
        return super().leave_SimpleStatementLine(original, updated)

    def leave_If(self, original, updated):
        """An `if isinstance(m, FSDP):` whose body the unwrapping emptied goes."""
        if self._emptied_unwrapping(original, updated):
            return self.remove_statement(original)
        return super().leave_If(original, updated)

    def leave_While(self, original, updated):
        """So does `while isinstance(m, FSDP): m = m.module` (transformers' unwrap_model): an FSDP2 model is the
        user's module itself."""
        if self._emptied_unwrapping(original, updated):
            return self.remove_statement(original)
        return updated

    def _emptied_unwrapping(self, original, updated) -> bool:
        test = original.test
        subject = dotted(test.args[0].value) if isinstance(test, cst.Call) and test.args else ""
        emptied = isinstance(updated.body, cst.IndentedBlock) and not updated.body.body and updated.orelse is None
        return emptied and bool(subject) and self._unwraps(test, subject)

    def _unwrapping(self, node: cst.Attribute) -> str | None:
        """The model `m` when `node` is `m.module` taken as the user's module where `isinstance(m, FSDP)` holds:
        `m.module if isinstance(m, FSDP) else m`, or the value returned or given back to `m` in the body of
        `if isinstance(m, FSDP):`."""
        subject = dotted(node.value)
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.IfExp) and parent.body is node:
            return subject if dotted(parent.orelse) == subject and self._unwraps(parent.test, subject) else None
        statement = stack[-3] if len(stack) >= 3 else None
        returned = isinstance(parent, cst.Return) and parent.value is node
        given_back = isinstance(parent, cst.Assign) and parent.value is node and [dotted(t.target) for t in parent.targets] == [subject]
        if not (returned or given_back) or not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return None
        block, branch = (stack[-4], stack[-5]) if len(stack) >= 5 else (None, None)
        inside = isinstance(branch, (cst.If, cst.While)) and branch.body is block and self._unwraps(branch.test, subject)
        if isinstance(branch, cst.While) and (returned or branch.orelse is not None):
            return None
        return subject if inside and (returned or len(block.body) == 1) else None

    def _unwraps(self, test, subject: str) -> bool:
        """`test` is `isinstance(subject, FSDP)` (the class alone)."""
        return (
            isinstance(test, cst.Call)
            and self.ctx.matches(test.func, "builtins.isinstance")
            and len(test.args) == 2
            and dotted(test.args[0].value) == subject
            and self.models.class_kind(test.args[1].value) is Kind.FSDP
            and not isinstance(test.args[1].value, cst.Tuple)
        )

    def _named_for_its_own(self, node: cst.Attribute) -> bool:
        """`raw_model = model.module` (nanoGPT's), where the name, bound once, is read only for attributes of the
        user's own class (`raw_model.estimate_mfu(...)`): each such read is the model's own under FSDP2."""
        stack = self.ctx.stack
        assign = stack[-2] if len(stack) >= 2 else None
        if not (isinstance(assign, cst.Assign) and assign.value is node and len(assign.targets) == 1):
            return False
        target = assign.targets[0].target
        scope = self.ctx.scope(target) if isinstance(target, cst.Name) else None
        bindings = list(scope[target.value]) if scope is not None else []
        if len(bindings) != 1 or not bindings[0].references:
            return False
        references = {id(access.node) for access in bindings[0].references}
        seen = 0
        for name, ancestors in walk(getattr(scope, "node", self.ctx.module)):
            if id(name) not in references:
                continue
            seen += 1
            read = ancestors[-1] if ancestors else None
            if not (isinstance(read, cst.Attribute) and read.value is name and _users_own(read.attr.value)):
                return False
            if len(ancestors) >= 2 and isinstance(ancestors[-2], (cst.Del, cst.AugAssign)):
                return False  # reads the inner module's attribute first
        return seen == len(references)  # every read found where the name lives

    def _reaches_the_users_own(self, node: cst.Attribute) -> bool:
        """`node` (`model.module`) is read for an attribute of the user's own model class (`.freeze()`,
        `.config`), not for nn.Module's enumeration or state API, and not assigned to."""
        parent = self.ctx.stack[-2] if len(self.ctx.stack) >= 2 else None
        if not (isinstance(parent, cst.Attribute) and parent.value is node):
            return False
        grand = self.ctx.stack[-3] if len(self.ctx.stack) >= 3 else None
        if isinstance(grand, (cst.AssignTarget, cst.Del, cst.AugAssign, cst.AnnAssign)) and grand.target is parent:
            return True  # `model.module.flag = x` sets the user's attribute on the model itself
        return _users_own(parent.attr.value)
