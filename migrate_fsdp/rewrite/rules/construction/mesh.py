"""MF106: `process_group` / `device_mesh` -> fully_shard's `mesh`, shaped by the sharding strategy.

fully_shard takes one DeviceMesh: 1-D to shard over it, 2-D to replicate over
dim 0 and shard over dim 1 (HSDP), which is also how FSDP1 reads a 2-D
`device_mesh` (`_init_process_group_state_for_hybrid_shard`; fully_shard wants
those dims named, so an unnamed one is rebuilt with the names). A process group
becomes `DeviceMesh.from_group`. Without either, FSDP1 shards over the
default group, and for HYBRID_SHARD builds intra-node shard groups and
inter-node replicate groups (`_init_intra_and_inter_node_groups`): the same
as a `(world // devices_per_node, devices_per_node)` mesh. NO_SHARD is a
`(world, 1)` mesh, and over a process group (or a 1-D mesh) of the user's a
`(group size, 1)` mesh replicating over that group (`_fsdp1_replicate_mesh`).

The mesh's device type must be where FSDP1 put the module: `device_id`'s type
when given (a CPU/gloo run stays on CPU), else the current accelerator, which
is also what FSDP2's default mesh uses, so then no mesh is written at all.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.parameter_loops import handed_in
from migrate_fsdp.rewrite.rules.construction.codegen import call, expression, string
from migrate_fsdp.rewrite.rules.construction.devices import device_type
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible
from migrate_fsdp.rewrite.rules.construction.sharding_strategy import HYBRID

SHARDING_HELPER = "_fsdp1_sharding"
SHARDING_OVER_HELPER = "_fsdp1_sharding_over"
HYBRID_MESH_HELPER = "_fsdp1_hybrid_mesh"
REPLICATE_MESH_HELPER = "_fsdp1_replicate_mesh"
GROUP_MESH_HELPER = "_fsdp1_group_mesh"


class MeshRule(KeywordRule):
    code = "MF106"
    name = "mesh"
    summary = "process_group / device_mesh (and the strategy's shape) -> fully_shard(mesh=...)"
    keywords = ("process_group", "device_mesh")

    def apply(self, argument, plan) -> None:
        if self.analysis.is_none(argument.value):
            return
        if argument.name == "process_group":  # the mesh and MF110's broadcast both read it
            plan.process_group = self.analysis.read_once(argument.value, plan, "process_group", "fsdp_process_group")
        elif "sync_module_states" in plan.arguments:  # MF110's broadcast reads it too
            plan.device_mesh = self.analysis.read_once(argument.value, plan, "mesh", "fsdp_mesh")
        else:
            plan.device_mesh = argument.value

    def finish(self, plan) -> None:
        group, user_mesh = plan.process_group, plan.device_mesh
        written = plan.arguments["process_group"].value if group is not None else None  # as the call has it
        if group is not None and user_mesh is not None:
            raise Unconvertible("FSDP1 rejects process_group and device_mesh together; keep one", written)
        strategy = plan.strategy
        if group is not None and strategy.may_be(HYBRID):
            # an (intra-node, inter-node) pair of groups, or one group, or None (FSDP1's default): read at run time
            name = strategy.runtime if strategy.runtime is not None else string(strategy.name)
            device = device_type(self.analysis, plan)
            mesh = call(self.ctx.add_helper(GROUP_MESH_HELPER), group, device)
            plan.sharding = call(self.ctx.add_helper(SHARDING_OVER_HELPER), name, mesh, device)
            plan.kwargs.pop("reshard_after_forward", None)  # the helper gives it, as for a strategy read at run time
            return
        if strategy.runtime is not None:
            if group is not None:  # FULL_SHARD, SHARD_GRAD_OP or NO_SHARD over the group's ranks
                over = self._from_group(group, plan)
                if handed_in(self.ctx, written):  # callers may leave it None: FSDP1's default group, on device_id's type
                    over = expression("OVER if GROUP is not None else None", OVER=over, GROUP=group)
                    plan.sharding = call(self.ctx.add_helper(SHARDING_OVER_HELPER), strategy.runtime, over, device_type(self.analysis, plan))
                    return
                plan.sharding = call(self.ctx.add_helper(SHARDING_OVER_HELPER), strategy.runtime, over)
                return
            device = [device_type(self.analysis, plan)] if plan.device is not None else []
            if user_mesh is not None:  # which may be None at run time: then the default group on `device`
                plan.sharding = call(self.ctx.add_helper(SHARDING_OVER_HELPER), strategy.runtime, user_mesh, *device)
            else:
                plan.sharding = call(self.ctx.add_helper(SHARDING_HELPER), strategy.runtime, *device)
            return
        plan.mesh = self._static_mesh(plan, group, user_mesh)
        if group is not None and handed_in(self.ctx, written):  # callers may leave it None: FSDP1's default group then
            default = self._static_mesh(plan, None, user_mesh)
            plan.mesh = expression("MESH if GROUP is not None else DEFAULT", MESH=plan.mesh, GROUP=group, DEFAULT=default or cst.Name("None"))

    def _static_mesh(self, plan, group, user_mesh) -> cst.BaseExpression | None:
        """The mesh for a sharding strategy written out (not HYBRID's over a group), None for fully_shard's default."""
        strategy = plan.strategy
        if strategy.name in HYBRID:
            if user_mesh is not None:
                return call(self.ctx.add_helper(HYBRID_MESH_HELPER), user_mesh)
            return self._init_mesh(plan, "(WORLD // PER_NODE, PER_NODE)", named=True)
        if strategy.name == "NO_SHARD" and (group is not None or user_mesh is not None):
            # replicated over the group's ranks: a (ranks, 1) mesh over the user's group (a 1-D mesh's, as FSDP1 read it)
            helper = self.ctx.add_helper(REPLICATE_MESH_HELPER)
            return call(helper, user_mesh) if user_mesh is not None else call(helper, group, device_type(self.analysis, plan))
        if strategy.name == "NO_SHARD":
            return self._init_mesh(plan, "(WORLD, 1)", named=True)
        if user_mesh is not None:
            return user_mesh
        if group is not None:
            return self._from_group(group, plan)
        if plan.device is not None:
            return self._init_mesh(plan, "(WORLD,)", named=False)
        return None

    def _from_group(self, group, plan) -> cst.BaseExpression:
        device_mesh = self.ctx.require_import("torch.distributed.device_mesh", "DeviceMesh")
        return expression(f"{device_mesh}.from_group(GROUP, DEVICE)", GROUP=group, DEVICE=device_type(self.analysis, plan))

    def _init_mesh(self, plan, shape: str, named: bool) -> cst.BaseExpression:
        anchor = plan.site.node
        init = self.ctx.require_import("torch.distributed.device_mesh", "init_device_mesh")
        names = ', mesh_dim_names=("replicate", "shard")' if named else ""
        device = device_type(self.analysis, plan)
        # FSDP1's node size: the device count of the module's device type (`torch.cpu.device_count()` is 1)
        if isinstance(device, cst.SimpleString) and device.evaluated_value in ("cuda", "cpu", "xpu", "mps"):
            per_node = f"{self.analysis.names.ref(anchor, f'torch.{device.evaluated_value}.device_count')}()"
        elif plan.device is None:  # device_type() is the current accelerator's
            per_node = f"{self.analysis.names.ref(anchor, 'torch.accelerator.device_count')}()"
        else:
            per_node = expression(f"{self.analysis.names.ref(anchor, 'torch.get_device_module')}(DEVICE).device_count()", DEVICE=device)
        return expression(
            f"{init}(DEVICE, {shape}{names})",
            DEVICE=device,
            WORLD=f"{self.analysis.names.ref(anchor, 'torch.distributed.get_world_size')}()",
            PER_NODE=per_node,
        )
