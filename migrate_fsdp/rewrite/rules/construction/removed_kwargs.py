"""MF108: FSDP1 arguments that fully_shard does not need: `device_id`, `limit_all_gathers`,
`use_orig_params`, `backward_prefetch=BACKWARD_PRE`.

Migration guide (seeds/002): device_id is inferred from the mesh's device;
limit_all_gathers is no longer needed (FSDP2 has no CPU synchronisation to
rate-limit); original parameters are always used; backward prefetching
always works like BACKWARD_PRE. `device_id` still says where the module
lives: the mesh takes its device type and, when needed, the rewrite makes it
the current device (devices.py). BACKWARD_POST, or turning backward
prefetching off, written out, have no FSDP2 form and are reported; a choice
made at run time (`BackwardPrefetch[cfg.prefetch]`) is dropped, as whatever
it holds only changes when gathers overlap, not what is computed.
"""


import libcst as cst

from migrate_fsdp.rewrite.analysis.kept_parameters import kept_message
from migrate_fsdp.rewrite.rules.construction.codegen import statements
from migrate_fsdp.rewrite.rules.construction.devices import set_current_device
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible

BACKWARD_PREFETCH = "torch.distributed.fsdp.BackwardPrefetch"


class RemovedKwargs(KeywordRule):
    code = "MF108"
    name = "removed-kwargs"
    summary = "device_id, limit_all_gathers, use_orig_params, backward_prefetch=BACKWARD_PRE: not needed by FSDP2"
    keywords = ("device_id", "limit_all_gathers", "use_orig_params", "backward_prefetch")
    leftovers = {
        BACKWARD_PREFETCH: (
            "BackwardPrefetch is FSDP1's; FSDP2 always prefetches in backward like BACKWARD_PRE (drop it) and offers "
            "FSDPModule.set_modules_to_backward_prefetch for explicit control"
        )
    }

    def apply(self, argument, plan) -> None:
        if argument.name == "device_id":
            if not self.analysis.is_none(argument.value):
                plan.device = argument.value
        elif argument.name == "backward_prefetch":
            self._backward_prefetch(argument, plan)
        else:  # dropped: a variable only this call read goes with it (`use_orig_params = True` / `else: ... False`)
            value, definition = self.analysis.follow(argument.value, plan)
            if argument.name == "use_orig_params" and self.analysis.literal_bool(value) is not False:
                plan.keeps_parameters = True
                self._parameters_kept(plan)
                plan.parameter_tags = self.analysis.literal_bool(value) is True and self.ctx.program.tags_parameters()
            if definition is None:
                plan.definitions.extend(self.analysis.assigned_on_branches(argument.value, plan) or ())

    def _parameters_kept(self, plan) -> None:
        kept = self.analysis.parameters_kept_before(plan.module, plan.site.node)
        if kept is not None:
            raise Unconvertible(kept_message(self.ctx.code(kept)))

    def tags_taken(self, plan, module, tags: str) -> list:
        """Before sharding: the attributes the program set on each parameter (FSDP1 with use_orig_params kept the
        Parameter objects, and so them; fully_shard makes new ones)."""
        names = self.analysis.names
        name, parameter = names.fresh(plan.site.node, "name", "fsdp_name"), names.fresh(plan.site.node, "parameter", "fsdp_parameter")
        taken = f"{{{name}: dict({parameter}.__dict__) for {name}, {parameter} in MODULE.named_parameters() if {parameter}.__dict__}}"
        line = cst.EmptyLine(comment=cst.Comment("# FSDP1 kept each parameter (use_orig_params), and what was set on it"))
        (statement,) = statements(f"{tags} = {taken}", MODULE=module)
        return [statement.with_changes(leading_lines=[line])]

    def tags_restored(self, plan, module, tags: str) -> list:
        """After sharding: the same attributes on the new parameters, found by name (FSDP2 keeps the names)."""
        names = self.analysis.names
        name, parameter = names.fresh(plan.site.node, "name", "fsdp_name"), names.fresh(plan.site.node, "parameter", "fsdp_parameter")
        return statements(
            f"for {name}, {parameter} in MODULE.named_parameters():\n    {parameter}.__dict__.update({tags}.get({name}, {{}}))",
            MODULE=module,
        )

    def _backward_prefetch(self, argument, plan) -> None:
        value, _ = self.analysis.follow(argument.value, plan)
        if self.ctx.matches(value, f"{BACKWARD_PREFETCH}.BACKWARD_PRE"):
            return
        if self.analysis.is_none(value):
            raise Unconvertible(
                "backward_prefetch=None turns backward prefetching off, which FSDP2 cannot do (it always prefetches "
                "like BACKWARD_PRE); drop the argument to accept prefetching"
            )
        if self.ctx.matches(value, f"{BACKWARD_PREFETCH}.BACKWARD_POST"):
            raise Unconvertible(
                "backward_prefetch=BACKWARD_POST has no FSDP2 form (FSDP2 prefetches like BACKWARD_PRE); drop it, or "
                "order prefetches yourself with FSDPModule.set_modules_to_backward_prefetch"
            )
        # Known only at run time (`BackwardPrefetch[cfg.prefetch]`, `... if cfg.prefetch else None`): whatever it
        # holds, FSDP2 prefetches like BACKWARD_PRE. Only the overlap of communication changes, not a number
        # computed, so the choice is dropped (docs/mapping.md) rather than keep the whole model FSDP1.
        if self.analysis.follow(argument.value, plan)[1] is None:
            plan.definitions.extend(self.analysis.assigned_on_branches(argument.value, plan) or ())

    def finish(self, plan) -> None:
        if plan.device is None:
            return
        setting = set_current_device(self.analysis, plan)
        if setting and not (plan.site.can_insert and not plan.site.in_lambda):
            raise Unconvertible(
                "device_id: fully_shard puts the module on the current device, so the device must be made current "
                "first (torch.accelerator.set_device_index), which cannot be inserted here; move the call to its own line",
                plan.arguments["device_id"].arg,
            )
        plan.before.extend(setting)
