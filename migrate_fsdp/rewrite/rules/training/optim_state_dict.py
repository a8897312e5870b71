"""MF203: FSDP1 optimizer-state APIs -> get/set_optimizer_state_dict.

FSDP1's optimizer state dicts go through static methods of the wrapper
(fully_sharded_data_parallel.py): `optim_state_dict` /
`optim_state_dict_to_load`, which follow the model's state-dict setting
(MF202), and the older `full_optim_state_dict`, `sharded_optim_state_dict`,
`shard_full_optim_state_dict`, `scatter_full_optim_state_dict` and
`flatten_sharded_optim_state_dict`, which fix it themselves. FSDP2 uses
`get_optimizer_state_dict(model, optim, options=...)` and
`set_optimizer_state_dict(model, optim, state, options=...)` of
torch.distributed.checkpoint.state_dict, with parameter names as keys like
FSDP1's.

The FSDP1 loaders return a dict the caller then passes to
`optim.load_state_dict(...)`; FSDP2's setter loads directly. So
`optim.load_state_dict(FSDP.optim_state_dict_to_load(...))`, the same split
over two statements (`osd = ...` then `optim.load_state_dict(osd)`), and
`load_directly=True` become one `fsdp2_set_optimizer_state_dict(...)`, the
setter with what FSDP1's load also took (its helper says what); any other
use of the returned dict is reported. `optim_state_dict_to_load` is
recognised in its current order `(model, optim, osd)`, in the legacy order
`(osd, model, optim)` of torch 1.x/2.0 and with keywords.
"""

import libcst as cst

from migrate_fsdp.rewrite.rule import OPTIMIZER_STATE
from migrate_fsdp.rewrite.rules.construction.codegen import call, statements
from migrate_fsdp.rewrite.rules.training.base import bind, literal_bool
from migrate_fsdp.rewrite.analysis.models import assignments_of
from migrate_fsdp.rewrite.rules.training.state_dicts import (
    ADVICE,
    OPTIM_LATER_HELPER,
    OPTIM_LOAD_HELPER,
    SHARDED_LOAD_HELPER,
    DEFAULT_SETTINGS,
    FULL,
    OPTIM_SIGNATURES,
    SHARDED,
    Builder,
    Settings,
    UsesStateDictPlan,
    model_key,
    model_state_call,
)
from migrate_fsdp.rewrite.syntax import dotted, subtree_ids, walk

_SHARDED_LOADER = "torch.distributed.checkpoint.optimizer.load_sharded_optimizer_state_dict"

_LOADERS = {
    # method: (signature, state-dict type, broadcast from rank 0)
    "shard_full_optim_state_dict": (("full_optim_state_dict", "model", "optim_input", "optim"), FULL, False),
    "scatter_full_optim_state_dict": (("full_optim_state_dict", "model", "optim_input", "optim", "group"), FULL, True),
    "flatten_sharded_optim_state_dict": (("sharded_optim_state_dict", "model", "optim"), SHARDED, False),
}
_TO_LOAD = OPTIM_SIGNATURES["optim_state_dict_to_load"]
_TO_LOAD_LEGACY = ("optim_state_dict", "model", "optim", "is_named_optimizer", "load_directly", "group")


class OptimStateDict(UsesStateDictPlan):
    code = "MF203"
    provides = frozenset({OPTIMIZER_STATE})
    name = "optim-state-dict"
    summary = "FSDP.optim_state_dict / optim_state_dict_to_load / full_optim_state_dict ... -> get/set_optimizer_state_dict"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._nested: dict[int, cst.Call] = {}  # id(outer load_state_dict call) -> replacement
        self._sharded_loads: dict[int, list] = {}  # id(block holding an FSDP1 sharded loader's line) -> [(the line,
        # its FSDP2 form, the model state taken for it)]
        self._to_expression: set[int] = set()  # `osd = loader(...)` lines that become a bare call
        self._removed: set[int] = set()  # the `optim.load_state_dict(osd)` lines those make redundant
        self._statement_loads: dict[str, set[int]] = {}  # optimizer -> ids of `osd` in `optimizer.load_state_dict(osd)` lines

    def leave_Call(self, original: cst.Call, updated: cst.Call):
        if id(original) in self._nested:
            return self._nested.pop(id(original))
        method = self.fsdp_method(original.func)
        if method == "rekey_optim_state_dict":
            self._report(original, "FSDP2's optimizer state dicts are keyed by parameter name already")
            return updated
        handler = {
            "optim_state_dict": self._get,
            "full_optim_state_dict": self._get_full_legacy,
            "sharded_optim_state_dict": self._get_sharded_legacy,
            "optim_state_dict_to_load": self._set,
            "shard_full_optim_state_dict": self._set_legacy,
            "scatter_full_optim_state_dict": self._set_legacy,
            "flatten_sharded_optim_state_dict": self._set_legacy,
        }.get(method)
        if handler is None or not self.fsdp2_ahead(original, governed=self.plan.in_block(original)):
            return updated
        result = handler(original, updated)
        if result is None:
            return updated
        self.ctx.mark_handled(original.func)
        return result

    def leave_SimpleStatementLine(self, original, updated):
        if id(original) in self._removed:
            return self.remove_statement(original)
        if id(original) in self._to_expression and isinstance(updated.body[0], cst.Assign):
            updated = updated.with_changes(body=[cst.Expr(updated.body[0].value)])
        return super().leave_SimpleStatementLine(original, updated)

    # ----- getters -----------------------------------------------------------------------

    def _get(self, original, updated):
        bound = bind(original, OPTIM_SIGNATURES["optim_state_dict"])
        if bound is None or "model" not in bound or "optim" not in bound:
            return self._report(original, "arguments not understood")
        settings = self._settings(original)
        if settings is None:
            return None
        given = bound.get("optim_state_dict")
        if given is not None and not _is_none(given) and not self._is_state_dict_of(given.value, bound["optim"]):
            return self._report(original, "a transformed `optim_state_dict` argument has no FSDP2 counterpart")
        if not self._default_group(bound):
            return None
        args = [self._arg(original, updated, bound, "model"), self._arg(original, updated, bound, "optim")]
        return Builder(self.ctx).get(
            "get_optimizer_state_dict", args, settings.kind, settings.optim_offload, settings.optim_rank0
        )

    def _get_full_legacy(self, original, updated):
        bound = bind(original, ("model", "optim", "optim_input", "rank0_only", "group"))
        if bound is None or "model" not in bound or "optim" not in bound:
            return self._report(original, "arguments not understood")
        rank0 = literal_bool(bound["rank0_only"].value) if "rank0_only" in bound else True
        if rank0 is None or not self._no_optim_input(bound) or not self._default_group(bound):
            return self._report(original, "`rank0_only` not True/False or `optim_input` given") if rank0 is None else None
        args = [self._arg(original, updated, bound, "model"), self._arg(original, updated, bound, "optim")]
        # FSDP1 offloads this one to CPU unconditionally (`_optim_state_dict_impl(cpu_offload=True)`).
        return Builder(self.ctx).get_full("get_optimizer_state_dict", args, True, rank0)

    def _get_sharded_legacy(self, original, updated):
        bound = bind(original, ("model", "optim", "group"))
        if bound is None or "model" not in bound or "optim" not in bound:
            return self._report(original, "arguments not understood")
        if not self._default_group(bound):
            return None
        args = [self._arg(original, updated, bound, "model"), self._arg(original, updated, bound, "optim")]
        build = Builder(self.ctx)
        return build.call("get_optimizer_state_dict", args, build.options(cpu_offload=True))

    # ----- loaders -----------------------------------------------------------------------

    def _set(self, original, updated):
        bound = self._bind_to_load(original)
        if bound is None:
            return self._report(original, "argument order not recognised")
        settings = self._settings(original)
        if settings is None:
            return None
        if literal_bool(bound["is_named_optimizer"].value) if "is_named_optimizer" in bound else False:
            return self._report(original, "`is_named_optimizer=True` (TorchRec/NamedOptimizer) is not converted")
        if not self._default_group(bound):
            return None
        sharded_load = None
        if self._from_sharded_loader(bound["optim_state_dict"].value):
            sharded_load = self._sharded_load(bound, settings)
            if sharded_load is not None:
                settings = sharded_load[3]
            else:
                return self._report(
                    original,
                    "its state comes from `load_sharded_optimizer_state_dict` (FSDP1's ShardedTensor form) other than "
                    "as `osd[key]` read only here, under SHARDED_STATE_DICT; with FSDP2 load into "
                    "`{key: get_optimizer_state_dict(model, optim)}` with `dcp.load(...)`, then set it",
                )
        load_directly = literal_bool(bound["load_directly"].value) if "load_directly" in bound else False
        broadcast = settings.kind == FULL and settings.optim_rank0
        nested = len(self._nested)
        result = self._load(original, updated, bound, settings.kind, broadcast, bound["optim"], load_directly)
        converted = result is not None or len(self._nested) > nested  # `optim.load_state_dict(FSDP...(...))` goes later
        if converted and sharded_load is not None:
            line, replacement, model_state, _ = sharded_load
            block = self._block_holding(line)
            if block is None:  # cannot happen: the loader is bound in the function at hand
                raise AssertionError("the sharded loader's line is not in a block around its use")
            self._sharded_loads.setdefault(id(block), []).append((line, replacement(), model_state))
        return result

    def _same_loader(self, statement, line) -> bool:
        """`statement` is the loader's `line` as other rules left it: `osd = load_sharded_optimizer_state_dict(...)`
        binding the same name (its arguments may have changed: `model.state_dict()` made FSDP2's)."""
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return False
        new, old = statement.body[0], line.body[0]
        if not (isinstance(new, cst.Assign) and isinstance(new.value, cst.Call) and len(new.targets) == 1):
            return False
        same_target = self.ctx.module.code_for_node(new.targets[0].target) == self.ctx.code(old.targets[0].target)
        return same_target and self.ctx.module.code_for_node(new.value.func) == self.ctx.code(old.value.func)

    def _block_holding(self, line):
        """The block around the node being visited that holds `line`: as a statement of its own, or inside one of
        its statements (a `with FSDP.state_dict_type(...)` block before it, spliced into it once converted)."""
        blocks = [n for n in reversed(self.ctx.stack) if isinstance(n, (cst.IndentedBlock, cst.Module))]
        for block in blocks:
            if any(statement is line for statement in block.body):
                return block
        for block in blocks:
            if any(node is line for node, _ in walk(*block.body)):
                return block
        return None

    def _sharded_load(self, bound, settings):
        """FSDP1's DCP resume, `osd = load_sharded_optimizer_state_dict(model_state_dict=..., optimizer_key=KEY,
        storage_reader=R)` then `FSDP.optim_state_dict_to_load(model, optim, osd[KEY])`: (the loader's line, a
        maker of its FSDP2 form, `osd = {KEY: fsdp2_load_optimizer_state(model, optim, KEY, storage_reader=R)}`,
        the settings it loads under), when `osd` is bound there only and read here only; None
        otherwise. The loader runs under SHARDED_STATE_DICT; the conversion may run there too, or after the block
        with no type set (fms-fsdp): FSDP1 then loads the same state (measured)."""
        value = bound["optim_state_dict"].value
        model, optim = bound["model"].value, bound["optim"].value
        if settings.kind != SHARDED and settings is not DEFAULT_SETTINGS:
            return None
        if not isinstance(value, cst.Subscript) or not isinstance(value.value, cst.Name):
            return None
        if not (dotted(model) and dotted(optim)) or len(value.slice) != 1 or not isinstance(value.slice[0].slice, cst.Index):
            return None
        assignments = assignments_of(self.ctx.scope(value.value), value.value.value)
        if len(assignments) != 1 or len(assignments[0].references) != 1:
            return None
        assign, line = self._assign_of(assignments[0].node)
        if assign is None or line is None:
            return None
        loader = bind(assign.value, ("model_state_dict", "optimizer_key", "storage_reader", "planner"))
        if loader is None or not {"optimizer_key", "storage_reader"} <= loader.keys():
            return None
        key = loader["optimizer_key"].value
        if self.ctx.code(key) != self.ctx.code(value.slice[0].slice.value):
            return None
        if settings.kind != SHARDED:
            settings = self._settings_around(line, model)
            if settings is None or settings.kind != SHARDED:
                return None
        name = value.value.value
        model_state = self._model_state_only_for(loader, line)

        def replacement() -> list[cst.BaseStatement]:
            # not resharded before the load line, which this runs while visiting: the model's state loaded just
            # before it left the model sharded, and the setter of the next line reshards
            readers = {k: loader[k].value for k in ("storage_reader", "planner") if k in loader}
            load = call(cst.Name(self.ctx.add_helper(SHARDED_LOAD_HELPER)), model, optim, key, **readers)
            return statements(f"{name} = {{KEY: LOAD}}", KEY=key, LOAD=load)

        return line, replacement, model_state, settings

    def _settings_around(self, line, model) -> Settings | None:
        """The settings of the converted `with FSDP.state_dict_type(model, ...)` block holding `line`, if any."""
        for context in self.plan.contexts:
            statement = context.statement
            block = isinstance(statement, cst.With) and context.converted and context.model == dotted(model)
            if block and any(node is line for node, _ in walk(statement.body)):
                return context.settings
        return None

    def _model_state_only_for(self, loader, line) -> str | None:
        """The name of the model state dict taken on the line right before the loader's (`sd = model.state_dict()`)
        only for its `model_state_dict=`, which FSDP2's load does not take: that line goes with it."""
        value = loader["model_state_dict"].value if "model_state_dict" in loader else None
        if not isinstance(value, cst.Name):
            return None
        assignments = assignments_of(self.ctx.scope(value), value.value)
        if len(assignments) != 1 or len(assignments[0].references) != 1:
            return None
        assign, state_line = self._assign_of(assignments[0].node)
        block = next((n for n in reversed(self.ctx.stack) if isinstance(n, (cst.IndentedBlock, cst.Module))), None)
        body = list(block.body) if block is not None else []
        index = next((i for i, statement in enumerate(body) if statement is line), 0)
        if state_line is None or index == 0 or body[index - 1] is not state_line:
            return None
        if not (isinstance(assign.value, cst.Call) and model_state_call(assign.value) == ("save", None)):
            return None
        return value.value

    def leave_IndentedBlock(self, original, updated):
        return super().leave_IndentedBlock(original, self._replace_sharded_loads(original, updated))

    def leave_Module(self, original, updated):
        return super().leave_Module(original, self._replace_sharded_loads(original, updated))

    def _replace_sharded_loads(self, original, updated):
        """The FSDP2 form of each FSDP1 sharded optimizer load of this block whose use converted (the load
        comes first, so it changes once its block is left); the loader's line is unchanged, found by value (its
        `with` block gone, it is a statement of this block)."""
        lines = self._sharded_loads.pop(id(original), [])
        if not lines:
            return updated
        body = list(updated.body)
        for line, replacement, model_state in lines:
            index = next(i for i, statement in enumerate(body) if self._same_loader(statement, line))
            first = index - 1 if model_state is not None and index > 0 and _assigns(body[index - 1], model_state) else index
            replacement[0] = replacement[0].with_changes(leading_lines=body[first].leading_lines)
            body[first : index + 1] = replacement
        return updated.with_changes(body=body)

    def _from_sharded_loader(self, node) -> bool:
        """`osd` (or `osd["optim"]`) assigned from torch.distributed.checkpoint's load_sharded_optimizer_state_dict,
        whose ShardedTensors only FSDP1's loader takes: FSDP2's setter would hand them to the optimizer."""
        while isinstance(node, cst.Subscript):
            node = node.value
        if isinstance(node, cst.Call):
            return self.ctx.matches(node.func, _SHARDED_LOADER)
        if not isinstance(node, cst.Name):
            return False
        assigned = [a.node for a in assignments_of(self.ctx.scope(node), node.value)]
        return any(
            isinstance(statement, cst.Assign) and isinstance(statement.value, cst.Call) and self.ctx.matches(statement.value.func, _SHARDED_LOADER)
            for statement, _ in (self._assign_of(target) for target in assigned)
        )

    def _assign_of(self, target) -> tuple:
        """(the Assign statement binding the Name `target` in the function, or module, at hand; its line when it is
        the line's only statement), each None when there is none."""
        where = next((n.body for n in reversed(self.ctx.stack) if isinstance(n, cst.FunctionDef)), self.ctx.module)
        for found, parents in walk(where):
            if found is target and len(parents) >= 2 and isinstance(parents[-1], cst.AssignTarget) and isinstance(parents[-2], cst.Assign):
                line = parents[-3] if len(parents) >= 3 else None
                return parents[-2], line if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1 else None
        return None, None

    def _bind_to_load(self, call: cst.Call):
        """The arguments by name, for the current `(model, optim, osd)` or the legacy `(osd, model, optim)` order.

        Positional arguments fit both orders; they are told apart by which one
        is the model, else by which one is the optimizer the result is loaded
        into (`o.load_state_dict(FSDP.optim_state_dict_to_load(osd, m, o))`).
        """
        needed = {"model", "optim", "optim_state_dict"}
        current, legacy = bind(call, _TO_LOAD), bind(call, _TO_LOAD_LEGACY)
        current = current if current is not None and needed <= current.keys() else None
        legacy = legacy if legacy is not None and needed <= legacy.keys() else None
        if current is None or legacy is None or current["model"] is legacy["model"]:
            return current or legacy
        if self._is_model(current["model"].value):
            return current
        if self._is_model(legacy["model"].value):
            return legacy
        found = self._find_consumer(call, self.ctx.stack, None)
        loader = dotted(found[1]) if found is not None else ""
        if loader and loader == dotted(legacy["optim"].value) != dotted(current["optim"].value):
            return legacy
        return current

    def _is_model(self, node) -> bool:
        """Whether `node` is the model of this call: an FSDP1 model, or the model of the state-dict context."""
        if self.models.is_fsdp_model(node):
            return True
        return any(context.model and context.model == model_key(node) for context in self.plan.contexts)

    def _set_legacy(self, original, updated):
        params, kind, broadcast = _LOADERS[original.func.attr.value]
        bound = bind(original, params)
        if bound is None or "model" not in bound or params[0] not in bound:
            return self._report(original, "arguments not understood")
        if not self._no_optim_input(bound) or not self._default_group(bound):
            return None
        bound = {**bound, "optim_state_dict": bound[params[0]]}
        return self._load(original, updated, bound, kind, broadcast, bound.get("optim"), False)

    def _load(self, original, updated, bound, kind, broadcast, optim_arg, load_directly):
        """`set_optimizer_state_dict(...)`, where the FSDP1 result is loaded into the optimizer right away."""
        stack = self.ctx.stack
        consumer = self._consumer(original, stack, optim_arg)
        if load_directly and isinstance(stack[-2], cst.Expr):
            consumer = ("statement", None)
        if consumer is None and "optim" in bound and self._loaded_later(stack, optim_arg):
            consumer = ("later", None)
        if consumer is None:
            return self._report(
                original,
                "its result is not passed straight to `optim.load_state_dict` (FSDP2's setter loads it itself)",
            )
        mode, optim = consumer
        build = Builder(self.ctx)
        state = self._arg(original, updated, bound, "optim_state_dict")
        if mode == "later":
            args = [self._arg(original, updated, bound, name) for name in ("model", "optim")] + [state]
            options = build.options(full_state_dict=build.full_state_dict(kind), broadcast_from_rank0=broadcast)
            return build.helper_call(OPTIM_LATER_HELPER, args, options)
        model = self._arg(original, updated, bound, "model")
        optim_node = self._arg(original, updated, bound, "optim") if "optim" in bound else optim
        options = build.options(full_state_dict=build.full_state_dict(kind), broadcast_from_rank0=broadcast)
        # FSDP1's load took what FSDP2's setter does not (shared `step` tensors, param-group settings the
        # optimizer lacks): the helper says how
        call = build.helper_call(OPTIM_LOAD_HELPER, [model, optim_node, state], options)
        if mode == "nested":
            outer = stack[-3]
            self._nested[id(outer)] = call
            self.ctx.mark_handled(original.func)
            return None
        return call

    def _consumer(self, original, stack, optim_arg):
        """How the loaded dict reaches `optim.load_state_dict`: ("nested"|"assigned", optimizer node) or None.

        For "assigned", the assignment becomes a bare call and the `load_state_dict` line goes.
        """
        found = self._find_consumer(original, stack, optim_arg)
        if found is None:
            return None
        mode, optim, statement, follower = found
        if mode == "assigned":
            self._to_expression.add(id(statement))
            self._removed.add(id(follower))
        return mode, optim

    def _loaded_later(self, stack, optim_arg) -> bool:
        """`osd = FSDP.optim_state_dict_to_load(...)` whose every read is a later `optim.load_state_dict(osd)` line
        of the same optimizer, elsewhere than right after it (after the `if` holding it, as a fallback's too)."""
        parent, statement = stack[-2], self.ctx.statement()
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
            and isinstance(statement, cst.SimpleStatementLine)
        ):
            return False
        target = parent.targets[0].target
        inside = subtree_ids(parent.value)  # `osd = FSDP.optim_state_dict_to_load(model, optim, osd)` reads it too
        references = [node for node in self._reached(statement, target) if id(node) not in inside]
        loads = self._statement_loads.get(dotted(optim_arg.value), set()) if optim_arg is not None else set()
        return bool(references) and all(id(node) in loads for node in references)

    def collect_SimpleStatementLine(self, node) -> None:
        small = node.body[0] if len(node.body) == 1 else None
        call = small.value if isinstance(small, cst.Expr) else None
        if self._is_load_state_dict(call, None) and len(call.args) == 1 and isinstance(call.args[0].value, cst.Name):
            self._statement_loads.setdefault(dotted(call.func.value), set()).add(id(call.args[0].value))

    def _find_consumer(self, original, stack, optim_arg):
        """(mode, optimizer node, assignment line, `load_state_dict` line) for `_consumer`, changing nothing."""
        parent, grandparent = stack[-2], stack[-3] if len(stack) >= 3 else None
        if isinstance(parent, cst.Arg) and self._is_load_state_dict(grandparent, optim_arg) and len(grandparent.args) == 1:
            return "nested", grandparent.func.value, None, None
        statement = self.ctx.statement()
        if not (
            isinstance(parent, cst.Assign)
            and len(parent.targets) == 1
            and isinstance(parent.targets[0].target, cst.Name)
            and isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
        ):
            return None
        target = parent.targets[0].target
        references = self._reached(statement, target)
        if len(references) != 1:
            return None
        follower = self._follower(statement, references[0], optim_arg)
        if follower is None:
            return None
        return "assigned", follower.body[0].value.func.value, statement, follower

    def _reached(self, statement, target: cst.Name) -> list:
        """The reads of `target` (bound by `statement`) its value may reach: scopes ignore order, so reads after a
        later statement that surely binds the name again (`osd = FSDP.optim_state_dict(...)`, also in a `with`
        block, in this block or one around it in the same function) do not count."""
        references = [r.node for a in assignments_of(self.ctx.scope(target), target.value) if a.node is target for r in a.references]
        stack = self.ctx.stack
        for index in range(stack.index(statement) - 1, -1, -1):
            block = stack[index]
            if isinstance(block, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                break
            if not isinstance(block, (cst.IndentedBlock, cst.Module)):
                continue
            body = list(block.body)
            for later in body[body.index(stack[index + 1]) + 1 :]:
                if _binds(later, target.value):
                    end = self.ctx.position(later)
                    return [node for node in references if self.ctx.position(node) < end]
        return references

    def _follower(self, statement, reference, optim_arg):
        """The later `optim.load_state_dict(osd)` line in the same block that uses `reference`."""
        block = self.ctx.stack[self.ctx.stack.index(statement) - 1]
        body = list(block.body)
        for later in body[body.index(statement) + 1 :]:
            if (
                isinstance(later, cst.SimpleStatementLine)
                and len(later.body) == 1
                and isinstance(later.body[0], cst.Expr)
                and self._is_load_state_dict(later.body[0].value, optim_arg)
                and len(later.body[0].value.args) == 1
                and later.body[0].value.args[0].value is reference
            ):
                return later
        return None

    @staticmethod
    def _is_load_state_dict(call, optim_arg) -> bool:
        if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "load_state_dict"):
            return False
        return optim_arg is None or dotted(call.func.value) == dotted(optim_arg.value) != ""

    # ----- shared ------------------------------------------------------------------------

    def _settings(self, original) -> Settings | None:
        settings = self.plan.settings_for(original)
        if settings is not None:
            return settings
        blocked = self.plan.blocked(original)
        if blocked is not None:
            self._report(original, blocked)
            return None
        if self.plan.unresolved:
            self._report(original, None)
            return None
        return DEFAULT_SETTINGS

    def _default_group(self, bound) -> bool:
        return self._absent(bound, "group", "FSDP2 takes the process group from the model's device mesh")

    def _no_optim_input(self, bound) -> bool:
        return self._absent(bound, "optim_input", "it is deprecated and has no FSDP2 counterpart")

    def _absent(self, bound, name: str, why: str) -> bool:
        """Whether the optional argument `name` is absent or None; reported when it is not."""
        arg = bound.get(name)
        if arg is None or _is_none(arg):
            return True
        call = next(n for n in reversed(self.ctx.stack) if isinstance(n, cst.Call))
        self._report(call, f"`{name}` given: {why}")
        return False

    def _report(self, call, reason: str | None):
        if reason is None:
            reason = "the state-dict type in force here is one this rule could not follow"
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else "?"
        self.ctx.report(call, self.code, f"`FSDP.{method}` not converted: {reason}; {ADVICE}")
        return None

    @staticmethod
    def _arg(original, updated, bound, name):
        return updated.args[original.args.index(bound[name])].value

    @staticmethod
    def _is_state_dict_of(node, optim_arg) -> bool:
        return (
            isinstance(node, cst.Call)
            and not node.args
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "state_dict"
            and dotted(node.func.value) == dotted(optim_arg.value) != ""
        )


def _is_none(arg: cst.Arg) -> bool:
    return isinstance(arg.value, cst.Name) and arg.value.value == "None"


def _binds(statement, name: str) -> bool:
    """Whether running `statement` surely binds `name` (`name = ...`, also inside a `with` block, or on every branch
    of an `if` chain with an `else`)."""
    if isinstance(statement, cst.SimpleStatementLine):
        return any(
            isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets)
            for small in statement.body
        )
    if isinstance(statement, cst.With) and isinstance(statement.body, cst.IndentedBlock):
        return any(_binds(inner, name) for inner in statement.body.body)
    if isinstance(statement, cst.If) and statement.orelse is not None:  # on every branch of an if/elif/else chain
        branches = [statement.body, statement.orelse if isinstance(statement.orelse, cst.If) else statement.orelse.body]
        return all(
            _binds(branch, name) if isinstance(branch, cst.If) else isinstance(branch, cst.IndentedBlock)
            and any(_binds(inner, name) for inner in branch.body)
            for branch in branches
        )
    return False


def _assigns(statement, name: str) -> bool:
    """`statement` is a line binding `name` alone (`name = ...`)."""
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    return isinstance(small, cst.Assign) and len(small.targets) == 1 and dotted(small.targets[0].target) == name
