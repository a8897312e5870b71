"""MF202: FSDP1 state-dict types and model state dicts -> torch.distributed.checkpoint.state_dict.

`with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg, optim_cfg):`
and `FSDP.set_state_dict_type(...)` (deprecated by torch itself in favour of
`get_state_dict` / `set_state_dict`, see their FutureWarning in
fully_sharded_data_parallel.py) go away; the calls they governed say what
they want instead:

    model.state_dict()           -> get_model_state_dict(model, options=StateDictOptions(...))
    model.load_state_dict(sd)    -> set_model_state_dict(model, sd, options=StateDictOptions(...))

with the options that reproduce FSDP1's FULL / SHARDED settings exactly
(state_dicts.py). An FSDP1 model's `state_dict()` outside any such block was
FSDP1's default, a full state dict on every rank, and is converted as such:
FSDP2's plain `state_dict()` would silently return DTensor shards. LOCAL
state dicts become sharded ones; configs known only at run time that cannot
be read again, and blocks whose model is handed to code we cannot follow, are
reported.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import Kind
from migrate_fsdp.rewrite.rules.construction.codegen import call, prepended
from migrate_fsdp.rewrite.rules.training.base import code_of
from migrate_fsdp.rewrite.rules.training.state_dicts import (
    ADVICE,
    ANY_MODULE_LOAD_HELPER,
    ANY_MODULE_SAVE_HELPER,
    DEFAULT_SETTINGS,
    Builder,
    UsesStateDictPlan,
    model_state_call,
    named_as_not_a_model,
)

_FSDP = "torch.distributed.fsdp"
# Names that only make sense as FSDP1 state-dict settings.
_SETTING_NAMES = tuple(
    f"{_FSDP}.{name}"
    for name in (
        "StateDictType",
        "StateDictConfig",
        "FullStateDictConfig",
        "ShardedStateDictConfig",
        "LocalStateDictConfig",
        "OptimStateDictConfig",
        "FullOptimStateDictConfig",
        "ShardedOptimStateDictConfig",
        "LocalOptimStateDictConfig",
        "StateDictSettings",
    )
)

class StateDictType(UsesStateDictPlan):
    code = "MF202"
    name = "state-dict-type"
    summary = "FSDP.state_dict_type / set_state_dict_type + model.state_dict() -> get/set_model_state_dict(options=...)"

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        method = self.fsdp_method(original.func)
        if method in ("state_dict_type", "set_state_dict_type"):
            context = self.plan.context_of(original)
            if context is not None and context.converted:
                self.ctx.mark_handled(original)
            else:
                reason = context.failure if context is not None else "not understood"
                self.ctx.report(original, self.code, f"`FSDP.{method}` not converted: {reason}; {ADVICE}")
            return updated
        if method == "get_state_dict_type":
            self.ctx.report(original, self.code, f"FSDP2 keeps no state-dict type on the model; {ADVICE}")
            return updated
        return self._model_state_call(original, updated)

    def leave_With(self, original: cst.With, updated):
        updated = self.attach_pending(original, updated)
        converted = [
            index
            for index, item in enumerate(original.items)
            if isinstance(item.item, cst.Call)
            and (context := self.plan.context_of(item.item)) is not None
            and context.converted
        ]
        return self.unwrap_with(updated, *converted) if converted else updated

    def leave_SimpleStatementLine(self, original, updated):
        if id(original) in self.plan.removed_statements:
            return self.remove_statement(original)
        planned = self.plan.config_statements.get(id(original))
        if planned is not None:
            reason = f"{planned[1]}; {ADVICE}" if planned[1] else "it serves only state-dict blocks that stay, reported there"
            self.ctx.report(original.body[0].value, self.code, f"FSDP1 state-dict setting kept: {reason}")
        return super().leave_SimpleStatementLine(original, updated)

    def leave_Attribute(self, original: cst.Attribute, updated):
        return self._stray_setting(original, updated)

    def leave_Name(self, original: cst.Name, updated):
        return self._stray_setting(original, updated)

    def _stray_setting(self, original, updated):
        """A state-dict setting used outside the contexts above (`t = StateDictType.FULL_STATE_DICT`)."""
        stack = self.ctx.stack
        parent = stack[-2] if len(stack) >= 2 else None
        if isinstance(parent, cst.Attribute) and parent.value is original:
            return updated
        if not any(q.startswith(_SETTING_NAMES) for q in self.ctx.qualified_names(original)):
            return updated
        if any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in stack) or self._handled(stack):
            return updated
        self.ctx.report(original, self.code, f"FSDP1 state-dict setting `{code_of(self.ctx, original)}`; {ADVICE}")
        return updated

    def _handled(self, stack) -> bool:
        for node in stack:
            if isinstance(node, cst.Call) and self.plan.context_of(node) is not None:
                return True
            if id(node) in self.plan.removed_statements or id(node) in self.plan.config_statements:
                return True
        return False

    # ----- model state dicts -------------------------------------------------------------

    def _model_state_call(self, original: cst.Call, updated: cst.Call):
        func = original.func
        if self.model_method(func, "state_dict", "load_state_dict") is None:
            return updated
        settings = self.plan.settings_for(original)
        blocked = self.plan.blocked(original)
        if blocked is not None:
            self.ctx.report(original, self.code, f"not converted: {blocked}; {ADVICE}")
            return updated
        if settings is None:
            receiver = func.value
            if self.models.is_fsdp_model(receiver):
                if self.models.is_fsdp2_module(receiver, self.ctx.stack):
                    return updated
            elif self.models.holder_origins(receiver, self.ctx.stack) is None:
                return self._any_module_state_call(original, updated)
            elif self.plan.contexts:
                self.ctx.report(
                    original,
                    self.code,
                    f"`{code_of(self.ctx, receiver)}` holds FSDP1 models, and a state-dict type this file sets on "
                    f"a model may apply to them; {ADVICE}",
                )
                return updated
            if self.plan.unresolved:
                self.ctx.report(
                    original,
                    self.code,
                    f"cannot tell which FSDP1 state-dict type is in force for `{code_of(self.ctx, func.value)}` "
                    f"here (this file sets one this rule could not follow); {ADVICE}",
                )
                return updated
            settings = DEFAULT_SETTINGS
        if not self.fsdp2_ahead(original, governed=self.plan.in_block(original)):
            return updated
        shape = model_state_call(original)
        if shape is None:
            self.ctx.report(original, self.code, f"arguments not understood; {ADVICE}")
            return updated
        model = updated.func.value
        build = Builder(self.ctx)
        full = build.full_state_dict(settings.kind)
        what, strict = shape
        if what == "save":
            return build.get("get_model_state_dict", [model], settings.kind, settings.model_offload, settings.model_rank0)
        state = updated.args[original.args.index(_state_arg(original))].value
        strict_value = updated.args[original.args.index(strict)].value if strict is not None else None
        if full is True and not isinstance(self.ctx.stack[-2], cst.Expr):
            # its result read (`missing_keys`): set_model_state_dict lists no key missing in a full load
            return self._load_helper_call(updated)
        options = build.options(full_state_dict=full, strict=strict_value)
        return build.call("set_model_state_dict", [model, state], options)

    def _any_module_state_call(self, original: cst.Call, updated: cst.Call):
        """A state dict of a receiver of unknown origin (`def load(model, path)`): where the program has an FSDP1
        model converting to FSDP2 reach it, a helper gives FSDP1's default (a full state dict) for an FSDP2 module
        and calls the method of any other, so the call serves every model the code is handed."""
        shape = model_state_call(original)
        if shape is None or self._not_a_model(original.func.value):
            return updated
        if not self.ctx.program.state_read(original.func):
            return updated
        if shape[0] == "save":
            return call(self.ctx.add_helper(ANY_MODULE_SAVE_HELPER), updated.func.value)
        return self._load_helper_call(updated)

    def _load_helper_call(self, updated: cst.Call) -> cst.Call:
        """`fsdp2_load_state_dict(model, <the arguments>)` for `model.load_state_dict(<the arguments>)` (the helper
        takes them by the same names): FSDP1's load, as the helper says."""
        return prepended(updated, self.ctx.add_helper(ANY_MODULE_LOAD_HELPER), updated.func.value)

    def _not_a_model(self, receiver) -> bool:
        """`receiver` is known not to be a wrapped model (built by a call of no model, a DDP model), or is named
        as an optimizer, scheduler or scaler is (`optimizer.load_state_dict(...)`), whose state dicts FSDP never
        changed."""
        return self.models.kind(receiver, self.ctx.stack) in (Kind.PLAIN, Kind.DDP) or named_as_not_a_model(receiver)


def _state_arg(call: cst.Call) -> cst.Arg:
    return next(a for a in call.args if a.keyword is None or a.keyword.value == "state_dict")
