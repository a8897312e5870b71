"""MF110: `sync_module_states=True` (+ a materialising `param_init_fn`) -> the FSDP2 meta-device flow.

The FSDP1 pattern: rank 0 builds the real model, the other ranks build it on
the meta device; `param_init_fn` materialises (`to_empty`) what is on meta,
and `sync_module_states=True` broadcasts rank 0's parameters and buffers
before sharding. FSDP2's flow (migration guide and tutorial, seeds/002):
`fully_shard` on meta, `to_empty`, then load rank 0's full state dict with
`set_model_state_dict(..., options=StateDictOptions(full_state_dict=True,
broadcast_from_rank0=True))`. The rewrite takes rank 0's state dict before
sharding, materialises the other ranks, loads it, and broadcasts the buffers
too (FSDP1 synced non-persistent buffers, which state dicts leave out).
A flag known only at run time (`sync_module_states=cfg.low_cpu_fsdp`) guards
taking rank 0's state dict and what comes after sharding, read each time.

Without sync_module_states, a materialising `param_init_fn` becomes a
`to_empty(recurse=False)` of each module still on meta after sharding, as
FSDP1 called it on each such module before sharding: the weights are
uninitialised either way until the program loads them (torchtune's meta-device
init, then a full state dict). A `param_init_fn` that initialises weights runs
where FSDP1 ran it: on each unit's unsharded modules right before sharding it,
the units in FSDP1's order, so it draws the same random numbers (emit.py,
fsdp1_param_init); with sync_module_states the helper then broadcasts rank 0's
tensors of the unit, as FSDP1 did. Reported: such a function with ignored
modules or a sync over a group or mesh, or a module built on meta with no
param_init_fn (FSDP1 materialised it with `reset_parameters()` behind the scenes).
"""

import textwrap

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import statements
from migrate_fsdp.rewrite.rules.construction.flags import flag, guarded
from migrate_fsdp.rewrite.rules.construction.plan import Initialiser, KeywordRule, ParamInit, Unconvertible
from migrate_fsdp.rewrite.rules.construction.sharding_strategy import HYBRID
from migrate_fsdp.rewrite.syntax import is_docstring, walk

_FLOW = (
    "with FSDP2: fully_shard on the meta device, then model.to_empty(device=...), then load weights "
    "(set_model_state_dict with StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)) or initialise them"
)


class MetaInitRule(KeywordRule):
    code = "MF110"
    name = "meta-init"
    summary = "sync_module_states + param_init_fn (meta-device init) -> fully_shard on meta, to_empty, broadcast from rank 0"
    keywords = ("sync_module_states", "param_init_fn")

    def apply(self, argument, plan) -> None:
        value, _ = self.analysis.follow(argument.value, plan)
        if argument.name == "sync_module_states":
            sync = flag(self.analysis, value, plan, "sync_module_states")  # at run time: the flow runs where it holds
            if sync is None:
                raise Unconvertible(f"sync_module_states={self.ctx.code(argument.value)} uses other FSDP1 names")
            plan.sync_module_states = sync
        elif not self.analysis.is_none(value):
            materialiser = self._materialiser(value)
            if materialiser is not None and self._synced_over_group(plan):
                materialiser = None  # FSDP1 broadcast from the group's first rank, unit by unit: run it as it ran
            plan.param_init = materialiser or Initialiser(value)
            definition = self.analysis.function_definition(value) if isinstance(plan.param_init, ParamInit) else None
            if definition is not None:
                plan.definitions.append(definition)  # the materialising `def` goes with the calls that read it

    def finish(self, plan) -> None:
        init = plan.param_init
        passed = plan.arguments["param_init_fn"] if init is not None else None
        if isinstance(init, Initialiser) and (plan.ignored is not None or (plan.syncs_each_unit and self._grouped(plan))):
            why = (
                "initialises weights with ignored modules"
                if plan.ignored is not None
                else "with sync_module_states over a device mesh or HYBRID_SHARD's pair of groups"
            )
            raise Unconvertible(
                f"param_init_fn={self.ctx.code(passed.value)} {why}: FSDP1 ran it on the unsharded modules of each "
                f"unit before sharding, then synced or skipped some; {_FLOW}",
                passed.arg,
            )
        again = self._initialised_again(plan) if init is not None else None
        if again is not None:
            raise Unconvertible(
                f"`{self.ctx.code(again)}` initialises the module again after wrapping: FSDP1 drew each rank's "
                f"numbers for its flat shard there, FSDP2 draws them for DTensors (other weights); {_FLOW}",
                passed.arg,
            )
        if isinstance(init, Initialiser):
            return
        if plan.sync_module_states is False:
            if init is not None:
                return  # materialised after sharding as FSDP1 did before it (materialise); the program loads the weights
            if plan.module is not None and self.analysis.built_on_meta(plan.module):
                raise Unconvertible(
                    "the module is built on the meta device: FSDP1 materialised it with reset_parameters(); " + _FLOW,
                    plan.arguments["module"].arg,
                )
            return
        arg = plan.arguments["sync_module_states"].arg
        mesh_checked_at_run_time = isinstance(plan.device_mesh, (cst.Name, cst.Attribute))
        sync = f"sync_module_states={self.ctx.code(arg.value)}"
        if plan.ignored is not None:
            ignored = next(plan.arguments[name] for name in ("ignored_modules", "ignored_states") if name in plan.arguments)
            raise Unconvertible(
                f"{sync} with {ignored.name}={self.ctx.code(ignored.value)} (FSDP1 broadcast all but the ignored "
                f"modules): broadcast rank 0's weights of the others yourself; {_FLOW}",
                arg,
            )
        if plan.device_mesh is not None and init is not None and not mesh_checked_at_run_time:
            raise Unconvertible(
                f"{sync} with device_mesh={self.ctx.code(plan.device_mesh)} and a param_init_fn: broadcast rank 0's "
                f"weights over that mesh yourself; {_FLOW}",
                arg,
            )

    def _synced_over_group(self, plan) -> bool:
        """sync_module_states (not a literal False) over a process group the call passes."""
        sync, group = plan.arguments.get("sync_module_states"), plan.arguments.get("process_group")
        if sync is None or group is None or self.analysis.is_none(group.value):
            return False
        return self.analysis.literal_bool(sync.value) is not False

    @staticmethod
    def _grouped(plan) -> bool:
        """Synced over a device mesh, or over HYBRID_SHARD's pair of groups (FSDP1 broadcast over each in turn); the
        unit-by-unit broadcast goes over one group, from its first rank."""
        return plan.device_mesh is not None or (plan.process_group is not None and plan.strategy.may_be(HYBRID))

    def _initialised_again(self, plan) -> cst.Call | None:
        """A `reset_parameters()` of the wrapped module, or of the model, after the call in its function (OLMo's
        re-initialisation after a meta-device materialisation)."""
        function = next((n for n in reversed(plan.site.stack) if isinstance(n, cst.FunctionDef)), None)
        if function is None:
            return None
        names = {self.ctx.code(plan.arguments["module"].value)} if "module" in plan.arguments else set()
        if plan.site.target is not None:
            names.add(self.ctx.code(plan.site.target))
        after = self.ctx.position(plan.site.node)
        for node, _ in walk(function.body):
            func = node.func if isinstance(node, cst.Call) else None
            if isinstance(func, cst.Attribute) and func.attr.value == "reset_parameters" and self.ctx.code(func.value) in names:
                if self.ctx.position(node) > after:
                    return node
        return None

    def _materialiser(self, value) -> ParamInit | None:
        """`lambda m: m.to_empty(device=D, ...)` (or a def doing only that), possibly `... if cond else None`."""
        if isinstance(value, cst.IfExp):
            if self.analysis.is_none(value.orelse):
                return self._materialiser(value.body)
            if self.analysis.is_none(value.body):
                return self._materialiser(value.orelse)
            return None
        if isinstance(value, cst.Lambda):
            params, body = value.params, value.body
        else:
            function = self.analysis.function(value)
            code = [] if function is None else [line for line in function.body.body if not is_docstring(line)]
            if len(code) != 1:
                return None
            statement = code[0]
            if not (isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Expr)):
                return None
            params, body = function.params, statement.body[0].value
        if isinstance(body, cst.IfExp) and self.analysis.is_none(body.orelse):
            # `lambda m: m.to_empty(...) if cond else None` (llama-recipes without the brackets): FSDP1 called it only
            # on modules with meta tensors, which it materialises wherever such a program works at all
            body = body.body
        if len(params.params) != 1 or not isinstance(body, cst.Call):
            return None
        func = body.func
        receiver = params.params[0].name.value
        if not (isinstance(func, cst.Attribute) and func.attr.value == "to_empty" and isinstance(func.value, cst.Name)):
            return None
        if func.value.value != receiver:
            return None
        device = next((a.value for a in body.args if a.keyword and a.keyword.value == "device"), None)
        return None if device is None else ParamInit(device)

    def before(self, plan, module, full_state_dict: str) -> list[cst.BaseStatement]:
        if self._broadcasts_before_sharding(plan):
            return self._broadcast_over_groups(plan, module)
        rank = self.analysis.names.ref(plan.site.node, "torch.distributed.get_rank")
        sync = "" if plan.sync_module_states is True else "SYNC and "  # a run-time flag guards each step
        return self._whole_world_mesh(plan, sync) + statements(
            f"{full_state_dict} = MODULE.state_dict() if {sync}{rank}() == 0 else {{}}", MODULE=module, SYNC=plan.sync_module_states
        )

    @staticmethod
    def _broadcasts_before_sharding(plan) -> bool:
        """Synced over a process group or device mesh of real tensors (a meta module needs the state-dict flow,
        which finish() allows with a mesh only)."""
        return plan.param_init is None and (plan.process_group is not None or plan.device_mesh is not None)

    def _broadcast_over_groups(self, plan, module) -> list[cst.BaseStatement]:
        """What FSDP1 did (`_sync_module_params_and_buffers`): move the module to `device_id`, then broadcast its
        parameters and buffers from the first rank of its group over the group: the process group; with a device
        mesh, the group of each mesh dimension (the shard group, then HYBRID's replicate group), or the world's
        when the mesh is None at run time. Ranks outside the group (model parallelism beside it) keep their own
        weights, which a broadcast from global rank 0 (the state-dict flow) would overwrite."""
        names, anchor = self.analysis.names, plan.site.node
        broadcast = names.ref(anchor, "torch.distributed.broadcast")
        first = names.ref(anchor, "torch.distributed.get_global_rank")
        tensor = names.fresh(anchor, "tensor", "fsdp_tensor")
        send = (
            f"for {tensor} in [*MODULE.parameters(), *MODULE.buffers()]:\n"
            f"    {broadcast}({tensor}.detach(), src={first}(GROUP, 0), group=GROUP)"
        )
        body = [] if plan.device is None else statements("MODULE.to(DEVICE)", MODULE=module, DEVICE=plan.device)
        if plan.process_group is not None:
            body += statements(send, MODULE=module, GROUP=plan.process_group)
        else:
            world = f"{names.ref(anchor, 'torch.distributed.group')}.WORLD"
            group = names.fresh(anchor, "group", "fsdp_group")
            groups = f"[MESH.get_group(dim) for dim in reversed(range(MESH.ndim))] if MESH is not None else [{world}]"
            loop = f"for {group} in {groups}:\n" + textwrap.indent(send, "    ")
            body += statements(loop, MODULE=module, MESH=plan.device_mesh, GROUP=group)
        return guarded(plan.sync_module_states, body)

    def _whole_world_mesh(self, plan, sync: str) -> list[cst.BaseStatement]:
        """FSDP1 synced a device mesh's ranks from its first rank (inter-node group, then intra-node): global
        rank 0's weights everywhere when the mesh holds every rank, which FSDP2's broadcast_from_rank0 also
        gives. A mesh over some ranks only (model parallelism beside it) is refused where it runs."""
        if plan.device_mesh is None:
            return []
        world = self.analysis.names.ref(plan.site.node, "torch.distributed.get_world_size")
        return statements(
            f"""
            if {sync}MESH is not None and MESH.size() != {world}():
                raise NotImplementedError("sync_module_states over a device mesh of some ranks: broadcast its first rank's weights over it")
            """,
            MESH=plan.device_mesh,
            SYNC=plan.sync_module_states,
        )

    def materialise(self, plan, module) -> list[cst.BaseStatement]:
        """Without sync_module_states: what FSDP1's `param_init_fn` (a `to_empty`) did to each module with tensors
        on the meta device, after sharding: the weights stay uninitialised there, as with FSDP1, until the
        program loads or initialises them (torchtune loads a full state dict next)."""
        names, anchor = self.analysis.names, plan.site.node
        submodule = names.fresh(anchor, "submodule", "fsdp_submodule")
        tensors = names.fresh(anchor, "tensors", "fsdp_tensors")
        tensor = names.fresh(anchor, "tensor", "fsdp_tensor")
        return statements(
            f"""
            for {submodule} in MODULE.modules():
                {tensors} = [*{submodule}.parameters(recurse=False), *{submodule}.buffers(recurse=False)]
                if any({tensor}.is_meta for {tensor} in {tensors}):
                    {submodule}.to_empty(device=DEVICE, recurse=False)
            """,
            MODULE=module,
            DEVICE=_materialised_on(plan),
        )

    def after(self, plan, module, full_state_dict: str, buffer: str) -> list[cst.BaseStatement]:
        if self._broadcasts_before_sharding(plan):  # synced before sharding
            return []
        names = self.analysis.names
        anchor = plan.site.node
        rank = names.ref(anchor, "torch.distributed.get_rank")
        broadcast = names.ref(anchor, "torch.distributed.broadcast")
        load = self.ctx.require_import("torch.distributed.checkpoint.state_dict", "set_model_state_dict")
        options = self.ctx.require_import("torch.distributed.checkpoint.state_dict", "StateDictOptions")
        result = []
        if plan.param_init is not None:
            result += statements(
                f"if {rank}() != 0:\n    MODULE.to_empty(device=DEVICE)", MODULE=module, DEVICE=_materialised_on(plan)
            )
        result += statements(
            f"""
            {load}(MODULE, {full_state_dict}, options={options}(full_state_dict=True, broadcast_from_rank0=True))
            for {buffer} in MODULE.buffers():
                {broadcast}({buffer}, src=0)
            """,
            MODULE=module,
        )
        return guarded(plan.sync_module_states, result)


def _materialised_on(plan) -> cst.BaseExpression:
    """Where meta tensors are materialised: FSDP1's device_id, else the device the param_init_fn gives."""
    return plan.device if plan.device is not None else plan.param_init.device
