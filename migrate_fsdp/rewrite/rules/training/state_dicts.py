"""FSDP1 state-dict settings in force at each call, and the FSDP2 calls that reproduce them.

FSDP1 decides what `model.state_dict()`, `model.load_state_dict()`,
`FSDP.optim_state_dict()` and `FSDP.optim_state_dict_to_load()` do from a
setting stored on the model: `with FSDP.state_dict_type(model, TYPE, cfg,
optim_cfg):` for a block, `FSDP.set_state_dict_type(...)` from then on, and
FULL_STATE_DICT with default configs otherwise (fully_sharded_data_parallel.py).
FSDP2 passes the same choice explicitly, as `StateDictOptions` of
torch.distributed.checkpoint.state_dict. This module reads the settings of
each context from the original tree (once per file, shared by MF202 and
MF203) and builds the replacement calls.

How FSDP1's configs map (checked against both implementations, see
docs/rules/MF202.md): FULL with `offload_to_cpu` and `rank0_only` both set or
both unset is `StateDictOptions(full_state_dict=True, cpu_offload=<both>)`
exactly (FSDP2's `cpu_offload` also keeps the result on rank 0 only). The two
mixed settings have no FSDP2 option, so a helper added to the file gathers
the sharded FSDP2 state dict tensor by tensor and moves it to CPU or keeps it
on rank 0 only, as FSDP1 did. Loading a FULL optimizer state with
`rank0_only=True` broadcasts from rank 0 (`broadcast_from_rank0=True`).
SHARDED maps to the sharded FSDP2 state dict, `offload_to_cpu` to
`cpu_offload`. So does LOCAL: FSDP2 has no flat parameters, and each rank's
own shards are its sharded state dict, keyed by parameter name (a program
saves and loads its own checkpoints as before; LOCAL files an FSDP1 run wrote
do not load, see docs/rules/MF202.md).

A context is removed only when every use of its model inside it is one this
code converts; a model passed to other code inside the block (a
`save_checkpoint(model)`) would silently lose the setting, so the context is
reported instead.
"""

import re
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import GlobalScope

from migrate_fsdp.rewrite.reshard import HELPER_NAME as RESHARD_HELPER
from migrate_fsdp.rewrite.reshard import reshard_before
from migrate_fsdp.rewrite.rule import FSDP2_MODELS, OPTIMIZER_STATE
from migrate_fsdp.rewrite.rules.training.base import RemovesStatements, bind, literal_bool
from migrate_fsdp.rewrite.syntax import chain_root, dotted, walk
from migrate_fsdp.rewrite.analysis.models import FSDP_CLASS, assignments_of, fsdp_models

FULL, SHARDED, LOCAL = "FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT"
DSD = "torch.distributed.checkpoint.state_dict"
ADVICE = (
    "with FSDP2 each call takes the setting: get/set_model_state_dict, get/set_optimizer_state_dict "
    "(torch.distributed.checkpoint.state_dict) with options=StateDictOptions(...)"
)
_FSDP = "torch.distributed.fsdp"
_CONTEXT_METHODS = ("state_dict_type", "set_state_dict_type")
_CONTEXT_PARAMS = ("module", "state_dict_type", "state_dict_config", "optim_state_dict_config")
# Optimizer-state methods whose result depends on the model's state-dict setting, with their parameters in FSDP1's
# order (the loader's current one; MF203 also reads its legacy `(osd, model, optim)`).
OPTIM_SIGNATURES = {
    "optim_state_dict": ("model", "optim", "optim_state_dict", "group"),
    "optim_state_dict_to_load": ("model", "optim", "optim_state_dict", "is_named_optimizer", "load_directly", "group"),
}
CONTEXT_OPTIM_METHODS = tuple(OPTIM_SIGNATURES)
LEGACY_OPTIM_METHODS = (
    "full_optim_state_dict",
    "sharded_optim_state_dict",
    "shard_full_optim_state_dict",
    "scatter_full_optim_state_dict",
    "flatten_sharded_optim_state_dict",
    "rekey_optim_state_dict",
)
OPTIM_METHODS = CONTEXT_OPTIM_METHODS + LEGACY_OPTIM_METHODS
_INSPECTING = ("builtins.isinstance", "builtins.type", "builtins.id", "builtins.print")
# FSDP2's state-dict calls take their options explicitly, so a setting around them changes nothing: a
# block that stays (reported) around calls already converted reads the same on a second run.
_EXPLICIT = tuple(
    f"{DSD}.{name}"
    for name in (
        "get_model_state_dict",
        "set_model_state_dict",
        "get_optimizer_state_dict",
        "set_optimizer_state_dict",
        "get_state_dict",
        "set_state_dict",
    )
)

# Config class -> (state-dict type it belongs to, is for the optimizer, field order).
_CONFIGS = {
    f"{_FSDP}.FullStateDictConfig": (FULL, False, ("offload_to_cpu", "rank0_only")),
    f"{_FSDP}.ShardedStateDictConfig": (SHARDED, False, ("offload_to_cpu", "_use_dtensor")),
    f"{_FSDP}.LocalStateDictConfig": (LOCAL, False, ("offload_to_cpu",)),
    f"{_FSDP}.FullOptimStateDictConfig": (FULL, True, ("offload_to_cpu", "rank0_only")),
    f"{_FSDP}.ShardedOptimStateDictConfig": (SHARDED, True, ("offload_to_cpu", "_use_dtensor")),
    f"{_FSDP}.LocalOptimStateDictConfig": (LOCAL, True, ("offload_to_cpu",)),
}


@dataclass(frozen=True)
class RunTimeKind:
    """A state-dict type known only at run time (`cfg.checkpoint_type`), read again where each state dict is
    taken: FULL, or sharded for SHARDED and LOCAL."""

    value: cst.BaseExpression


FULL_KIND_HELPER = "_fsdp1_full_state_dict"


@dataclass(frozen=True)
class Settings:
    """The state-dict type in force (a kind, or RunTimeKind) and its configs' flags: each True, False, or an
    expression read at run time."""

    kind: str | RunTimeKind = FULL
    model_offload: object = False
    model_rank0: object = False
    optim_offload: object = True
    optim_rank0: object = False


DEFAULT_SETTINGS = Settings()


@dataclass
class Context:
    """One `FSDP.state_dict_type(...)` block or `FSDP.set_state_dict_type(...)` statement."""

    call: cst.Call
    statement: cst.CSTNode  # the With, or the statement line of the set call
    model: str = ""
    settings: Settings | None = None
    failure: str | None = None
    uses: list = field(default_factory=list)  # calls converted with these settings
    config_names: list = field(default_factory=list)  # Name nodes of config arguments
    handed_on: bool = False  # the model is handed to a function while the setting applies (the program follows it)
    wrapped_here: bool = False  # the model is a name this function wrapped: where it goes, the program follows

    @property
    def converted(self) -> bool:
        return self.failure is None


def _fsdp2_default(settings: Settings | None) -> bool:
    """The model's state dict under `settings` is what FSDP2's own `state_dict()` gives: each rank's shards by
    parameter name (SHARDED, and LOCAL, which converts as SHARDED), left where they are."""
    return settings is not None and settings.kind in (SHARDED, LOCAL) and settings.model_offload is False


class StateDictPlan:
    """Settings per call, decided once the read-only pass has seen the whole file."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.contexts: list[Context] = []
        self._pending: list[tuple[cst.Call, tuple]] = []  # context calls, with their stacks
        self._noted: set[int] = set()
        self._settings: dict[int, Settings] = {}  # id(call) -> settings in force
        self._context_of: dict[int, Context] = {}  # id(call) -> its context
        self._blocked: dict[int, Context] = {}  # id(call) -> the unreadable context governing it
        self._in_block: set[int] = set()  # id(call) of calls in a `with FSDP.state_dict_type(...)` block
        self.removed_statements: set[int] = set()
        self.config_statements: dict[int, tuple] = {}  # id(config line) -> (line, why it stays; None: only for blocks that stay)
        self.built = False

    # ----- collecting --------------------------------------------------------------------

    def note_call(self, call: cst.Call) -> None:
        if id(call) not in self._noted and self._fsdp_method(call.func) in _CONTEXT_METHODS:
            self._noted.add(id(call))
            self._pending.append((call, tuple(self.ctx.stack)))

    def _fsdp_method(self, func) -> str | None:
        if isinstance(func, cst.Attribute) and self.ctx.matches(func, f"{FSDP_CLASS}.{func.attr.value}"):
            return func.attr.value
        return None

    # ----- deciding ----------------------------------------------------------------------

    def build(self, optim_rule_selected: bool, wrap_selected: bool) -> None:
        if self.built:
            return
        self.built = True
        for call, stack in self._pending:
            context = self._context(call, stack, optim_rule_selected)
            if not wrap_selected:
                context.failure = "MF101 (wrap-call) is not selected, so the models stay FSDP1"
            elif context.failure is None:
                lasting = context.handed_on or self._fsdp_method(call.func) == "set_state_dict_type"
                denial = self.ctx.program.use(
                    call, "MF202", stack, lasting=lasting, governed=not lasting, fsdp2_default=_fsdp2_default(context.settings)
                )
                context.failure = denial.message if denial is not None else None
            self.contexts.append(context)
            self._context_of[id(call)] = context
        self._plan_config_statements()

    def _context(self, call, stack, optim_rule_selected) -> Context:
        method = self._fsdp_method(call.func)
        statement, region = self._region(call, stack, method)
        context = Context(call, statement)
        bound = bind(call, _CONTEXT_PARAMS)
        if bound is None or "module" not in bound or "state_dict_type" not in bound:
            context.failure = "arguments not understood"
            return context
        context.model = model_key(bound["module"].value)
        module = bound["module"].value
        context.wrapped_here = isinstance(module, cst.Name) and fsdp_models(self.ctx).wrapped_here(module, stack)
        for name in ("state_dict_type", "state_dict_config", "optim_state_dict_config"):
            value = bound[name].value if name in bound else None
            if isinstance(value, cst.Name) and value.value != "None" and (name != "state_dict_type" or self._type_of(value)):
                context.config_names.append(value)  # its definition goes with the contexts it serves
        settings, failure = self._settings_of(bound, region if method == "state_dict_type" else None)
        context.settings = settings
        if failure is None and not context.model:
            failure = "the model is not a plain name or attribute chain"
        if failure is None and statement is None:
            if method == "set_state_dict_type":
                failure = "`FSDP.set_state_dict_type` not a statement of its own in a function or module body"
            elif isinstance(stack[-2], cst.WithItem) and stack[-2].asname is not None:
                failure = "it is bound by `with ... as`, a name this rule would have to remove"
            else:
                failure = "`FSDP.state_dict_type` outside a `with` statement"
        if context.model:
            problem = self._check_region(context, region, method, stack, optim_rule_selected)
            failure = failure or problem
        context.failure = failure
        return context

    def _region(self, call, stack, method):
        """The statement holding the context, and the statements it governs."""
        if method == "state_dict_type":
            item = stack[-2] if len(stack) >= 2 else None
            with_node = stack[-3] if len(stack) >= 3 else None
            if isinstance(item, cst.WithItem) and isinstance(with_node, cst.With) and item.item is call and item.asname is None:
                return with_node, [with_node.body]
            return None, []
        expr, line, block = (stack[-2], stack[-3], stack[-4]) if len(stack) >= 4 else (None, None, None)
        if (
            isinstance(expr, cst.Expr)
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
            and isinstance(block, (cst.IndentedBlock, cst.Module))
        ):
            body = list(block.body)
            index = next(i for i, s in enumerate(body) if s is line)
            return line, body[index + 1 :]
        return None, []

    def _settings_of(self, bound, block=None) -> tuple[Settings | None, str | None]:
        """The settings of a context, `block` the body of a `with` one (where a type known only at run time is
        read again)."""
        value = bound["state_dict_type"].value
        kind = self._type_of(value)
        if kind is None:
            if isinstance(value, cst.Subscript) and self.ctx.matches(value.value, f"{_FSDP}.StateDictType"):
                value = _single_index(value) or value  # `StateDictType[name]`: the helper takes the name itself
            problem = self._run_time_kind(value, bound, block)
            return (Settings(RunTimeKind(value)), None) if problem is None else (None, problem)
        # FSDP1's default optimizer config offloads, but not LOCAL's (api.py: LocalOptimStateDictConfig)
        values = {"model": (False, False), "optim": (kind != LOCAL, False)}
        for name, for_optim in (("state_dict_config", False), ("optim_state_dict_config", True)):
            arg = bound.get(name)
            if arg is None or (isinstance(arg.value, cst.Name) and arg.value.value == "None"):
                continue
            parsed = self.parse_config(arg.value)
            if isinstance(parsed, str):
                return None, parsed
            config_kind, config_for_optim, offload, rank0 = parsed
            if config_kind != kind or config_for_optim != for_optim:
                return None, f"`{self.ctx.code(arg.value)}` does not match {kind} (FSDP1 raises on it)"
            values["optim" if for_optim else "model"] = (offload, rank0)
        (model_offload, model_rank0), (optim_offload, optim_rank0) = values["model"], values["optim"]
        # LOCAL's flat-parameter shards have no FSDP2 form; each rank's own shards, by name, are FSDP2's sharded state
        kind = SHARDED if kind == LOCAL else kind
        return Settings(kind, model_offload, model_rank0, optim_offload, optim_rank0), None

    def _run_time_kind(self, value, bound, block) -> str | None:
        """Why the type, not a member written out, cannot be read again where each state dict of the block is
        taken, if it cannot: it must be a plain name or attribute chain (`cfg.checkpoint_type`) of a `with`
        block that does not rebind it, given without configs (FSDP1 raises where a config's type is not the
        type in force, which only the run knows)."""
        problem = "the state-dict type is not a `StateDictType.` member written out"
        if block is None:
            return f"{problem}, and `FSDP.set_state_dict_type` keeps it for code out of this block"
        parts = [value] if not isinstance(value, cst.Subscript) else [value.value, _single_index(value)]
        readable = all(dotted(part) or isinstance(part, (cst.SimpleString, cst.Integer)) for part in parts)
        if not readable or any(self.ctx.fsdp1_names(part) for part in parts):
            return f"{problem} nor a name, attribute chain or item of one (`TYPES[cfg.kind]`) to read again"
        if any(not _is_none(bound[name].value) for name in ("state_dict_config", "optim_state_dict_config") if name in bound):
            return f"{problem}, and a config goes with it (FSDP1 raises where their types differ, known only at run time)"
        roots = {chain_root(part) for part in parts} - {""}
        for node, _ in walk(*block):
            targets = node.targets if isinstance(node, cst.Assign) else [node] if isinstance(node, (cst.AugAssign, cst.AnnAssign)) else []
            rebound = next((chain_root(t.target) for t in targets if chain_root(t.target) in roots), None)
            if rebound is not None:
                return f"{problem}, and the block assigns `{rebound}`, which FSDP2's calls would read again"
        return None

    def _type_of(self, node) -> str | None:
        """The member `node` names: written out, or a name assigned it once (`FULL = StateDictType.FULL_STATE_DICT`)."""
        if isinstance(node, cst.Name) and node.value != "None":
            node = self._single_value(node)
        for kind in (FULL, SHARDED, LOCAL):
            if self.ctx.matches(node, f"{_FSDP}.StateDictType.{kind}"):
                return kind
        return None

    def parse_config(self, node):
        """(type, for optimizer, offload_to_cpu, rank0_only) of a config call or a name bound once to one."""
        call = node
        if isinstance(node, cst.Name):
            call = self._single_value(node)
            if call is None:
                return f"`{node.value}` is not assigned a state-dict config exactly once in this file"
        if not isinstance(call, cst.Call):
            return f"`{self.ctx.code(node)}` is not a state-dict config built here"
        config = next((c for c in _CONFIGS if self.ctx.matches(call.func, c)), None)
        if config is None:
            return f"`{self.ctx.code(call.func)}` is not a state-dict config class FSDP1 accepts here"
        kind, for_optim, params = _CONFIGS[config]
        bound = bind(call, params)
        if bound is None:
            return f"arguments of `{self.ctx.code(call)}` not understood"
        offload_default = for_optim and kind != LOCAL
        flags = []
        for name, default in (("offload_to_cpu", offload_default), ("rank0_only", False)):
            value = bound[name].value if name in bound else None
            flag = default if value is None else literal_bool(value)
            if flag is None and self._read_again(value, moved=call is not node):
                flag = value  # evaluated where the FSDP2 call is, to the same value
            if flag is None:
                return (
                    f"`{' '.join(self.ctx.code(call).split())}` has a value known only at run time that cannot be "
                    "read again where the state dict is taken; write True/False"
                )
            flags.append(flag)
        return (kind, for_optim, *flags)

    def _read_again(self, value, moved: bool) -> bool:
        """Whether `value` (`cfg.offload`, `torch.cuda.is_available()`) gives the same where the config is used:
        no side effects, and, for a config defined at module level and used in functions, only global names."""
        if isinstance(value, cst.Call):
            names = self.ctx.qualified_names(value.func)
            if not names or not all(q.startswith("torch.") for q in names):
                return False
            if any(arg.star or not isinstance(arg.value, (cst.SimpleString, cst.Integer, cst.Name)) for arg in value.args):
                return False
            value = value.func
        root = chain_root(value)
        if not root:
            return False
        if not moved:
            return True
        scope = self.ctx.scope(value)
        if scope is None or not isinstance(scope, GlobalScope):
            return True  # a config of the function itself, used in that function
        assignments = assignments_of(scope, root)
        return bool(assignments) and all(a.scope is scope for a in assignments)

    def _single_value(self, name: cst.Name):
        assignments = assignments_of(self.ctx.scope(name), name.value)
        if len(assignments) != 1:
            return None
        statement = self._assign_statement(assignments[0].node)
        return statement.body[0].value if statement is not None else None

    def _assign_statement(self, target):
        """The `name = value` line that assigns `target` (single target, alone on its line)."""
        statement = self._statements.get(id(target))
        if statement is None:
            return None
        assign = statement.body[0]
        return statement if len(assign.targets) == 1 and assign.targets[0].target is target else None

    @property
    def _statements(self) -> dict:
        """id(Name target) -> the simple `Assign` line holding it, for the whole module (built once)."""
        if not hasattr(self, "_statement_index"):
            index = {}
            for node, _ in walk(self.ctx.module):
                if (
                    isinstance(node, cst.SimpleStatementLine)
                    and len(node.body) == 1
                    and isinstance(node.body[0], cst.Assign)
                ):
                    for target in node.body[0].targets:
                        index[id(target.target)] = node
            self._statement_index = index
        return self._statement_index

    def _check_region(self, context, region, method, stack, optim_rule_selected) -> str | None:
        """Collect the calls the context governs; the first use that keeps it from being removed, if any."""
        problems = []
        if method == "set_state_dict_type":  # its setting outlives the statement, with or without uses after it here
            problems.append(self._set_context_escape(context, stack))
        holders = _holders(context.model)
        chain = holders | {context.model}  # `trainer` inside `trainer.model` is the model, not its holder
        optimizers = self._optimizers(region)  # `self.opt` given to FSDP's optimizer-state API: a torch optimizer
        for node, parents in walk(*region):
            if not isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)):
                continue
            name = model_key(node)
            if not name:
                continue
            if name == context.model:
                problems.append(self._region_use(context, node, parents, optim_rule_selected))
            elif (
                name in holders
                and not (parents and model_key(parents[-1]) in chain | optimizers)
                and not (parents and isinstance(parents[-1], cst.Attribute) and named_as_not_a_model(parents[-1]))
                and not self._handed_to_fsdp(node, parents)
            ):
                # `trainer.save_model()` under a setting on `trainer.model`: the holder reaches the model out of sight
                problems.append(
                    f"`{name}` holds `{context.model}` and may read the setting out of sight ({self._describe(node, parents)})"
                )
        return next((p for p in problems if p is not None), None)

    def _optimizers(self, region) -> set[str]:
        """The optimizers (`self.opt`) that FSDP's optimizer-state calls in `region` take: their own methods
        (`self.opt.load_state_dict(osd)`) read no setting of the model."""
        found = set()
        for node, _ in walk(*region):
            method = self._fsdp_method(node.func) if isinstance(node, cst.Call) else None
            if method in CONTEXT_OPTIM_METHODS:
                bound = bind(node, OPTIM_SIGNATURES[method])
                if bound is not None and "optim" in bound and dotted(bound["optim"].value):
                    found.add(dotted(bound["optim"].value))
        return found

    def _handed_to_fsdp(self, node, parents) -> bool:
        """`FSDP.optim_state_dict(self.model, self.opt)`: an attribute of the holder given to FSDP's own API, which
        keeps nothing (the holder itself reaches no other code)."""
        if len(parents) < 3 or not (isinstance(parents[-1], cst.Attribute) and parents[-1].value is node):
            return False
        return isinstance(parents[-2], cst.Arg) and self._reads_only(parents[-3])

    def _region_use(self, context, node, parents, optim_rule_selected) -> str | None:
        parent = parents[-1] if parents else None
        if isinstance(parent, cst.Attribute) and parent.value is node:
            call = parents[-2] if len(parents) >= 2 else None
            if isinstance(call, cst.Call) and call.func is parent and parent.attr.value in ("state_dict", "load_state_dict"):
                context.uses.append(call)
                if model_state_call(call) is None:
                    return f"`{self.ctx.code(call)}` has arguments this rule does not convert"
            return None  # other methods and attributes of the model do not read the setting
        if isinstance(parent, cst.Call) and parent.func is node:
            return None  # model(x)
        if isinstance(parent, cst.Arg) and len(parents) >= 2 and isinstance(parents[-2], cst.Call):
            outer = parents[-2]
            method_name = self._fsdp_method(outer.func)
            if method_name in OPTIM_METHODS:
                if method_name in CONTEXT_OPTIM_METHODS:
                    context.uses.append(outer)
                return None if optim_rule_selected else "MF203 (optimizer state) is not selected, and it needs this setting"
            if method_name in _CONTEXT_METHODS:
                return "another state-dict type is set on the same model inside it"
            if self._reads_only(outer):
                return None
        if context.wrapped_here and _handed_on(parent, parents):
            context.handed_on = True
            return None
        return f"`{context.model}` is used where the state-dict setting may apply out of sight ({self._describe(node, parents)})"

    def _set_context_escape(self, context, stack) -> str | None:
        """`set_state_dict_type` lasts beyond the call: only a wrapper made here and never handed out can be followed."""
        function = next((n for n in reversed(stack) if isinstance(n, cst.FunctionDef)), None)
        node = context.call.args[0].value if context.call.args else None
        if function is None or not isinstance(node, cst.Name):
            return "the setting outlives this function (module level, or an attribute)"
        if not fsdp_models(self.ctx).wrapped_here(node, stack):
            return "the model was not wrapped in this function, so code elsewhere may see the setting"
        for access_node, parents in walk(function.body):
            if not (isinstance(access_node, cst.Name) and access_node.value == node.value):
                continue
            parent = parents[-1] if parents else None
            if isinstance(parent, cst.Attribute) and parent.value is access_node:
                continue
            if isinstance(parent, cst.Call) and parent.func is access_node:
                continue
            if isinstance(parent, cst.AssignTarget) or (isinstance(parent, cst.Arg) and self._reads_only(parents[-2])):
                continue
            if context.wrapped_here and _handed_on(parent, parents):
                context.handed_on = True
                continue
            return f"`{node.value}` is handed to other code ({self._describe(access_node, parents)}), where the setting would still apply"
        return None

    def _describe(self, node, parents) -> str:
        """The call or statement around a use, shortened, for a message."""
        around = next((p for p in reversed(parents) if isinstance(p, (cst.Call, cst.BaseSmallStatement))), node)
        text = " ".join(self.ctx.code(around).split())
        return f"`{text if len(text) <= 60 else text[:57] + '...'}`"

    def _reads_only(self, call) -> bool:
        """Calls that take the model without keeping it or reading the setting: FSDP's own, type checks, FSDP2's
        (a reshard or state-dict helper the rewrite put there included: each says its options itself)."""
        return isinstance(call, cst.Call) and (
            self._fsdp_method(call.func) is not None
            or self.ctx.matches(call.func, FSDP_CLASS, *_INSPECTING, *_EXPLICIT)
            or isinstance(call.func, cst.Name) and call.func.value in _REWRITE_HELPERS
        )

    def _plan_config_statements(self) -> None:
        """Config assignments go with their contexts; one that stays must be reported."""
        users: dict[int, tuple] = {}
        for context in self.contexts:
            for name in context.config_names:
                statement = self._config_statement(name)
                if statement is not None:
                    users.setdefault(id(statement), (statement, []))[1].append(context)
        for statement_id, (statement, contexts) in users.items():
            failures = [c.failure for c in contexts if c.failure]
            only_contexts = self._only_used_by_contexts(statement)
            if not only_contexts and self._type_of(statement.body[0].value):
                continue  # a type the program also reads: reported as any setting out of a block is
            if only_contexts and len(failures) == len(contexts):
                reason = None  # kept with the contexts it serves, which are reported
            else:
                reason = failures[0] if failures else "it is also used by code this rule does not convert"
            self.config_statements[statement_id] = (statement, reason)
            if not failures and only_contexts:
                self.removed_statements.add(statement_id)
        for context in self.contexts:
            for use in context.uses:
                if isinstance(context.statement, cst.With):
                    self._in_block.add(id(use))
                if context.settings is not None:
                    self._settings[id(use)] = context.settings
                else:
                    self._blocked[id(use)] = context
            if context.converted and isinstance(context.statement, cst.SimpleStatementLine):
                self.removed_statements.add(id(context.statement))

    def _config_statement(self, name: cst.Name):
        assignments = assignments_of(self.ctx.scope(name), name.value)
        return self._assign_statement(assignments[0].node) if len(assignments) == 1 else None

    def _only_used_by_contexts(self, statement) -> bool:
        target = statement.body[0].targets[0].target
        context_names = {id(n) for c in self.contexts for n in c.config_names}
        return all(
            id(access.node) in context_names
            for assignment in assignments_of(self.ctx.scope(target), target.value)
            for access in assignment.references
        )

    # ----- answering ---------------------------------------------------------------------

    def settings_for(self, call: cst.Call) -> Settings | None:
        """Settings of the context governing `call`, None when it is governed by no context."""
        return self._settings.get(id(call))

    def in_block(self, call: cst.Call) -> bool:
        """`call` is governed by a `with FSDP.state_dict_type(...)` block: a type set on its model for good elsewhere
        does not reach it."""
        return id(call) in self._in_block

    def blocked(self, call: cst.Call) -> str | None:
        """Why the settings governing `call` are unknown, when it sits in a context this code cannot read."""
        context = self._blocked.get(id(call))
        if context is None:
            return None
        return f"governed by the `FSDP.{context.call.func.attr.value}` that is reported above"

    def context_of(self, call: cst.Call) -> Context | None:
        return self._context_of.get(id(call))

    @property
    def unresolved(self) -> bool:
        """A context this file sets but we could not follow: FSDP1's default may not hold elsewhere."""
        return any(not c.converted for c in self.contexts)


def model_state_call(call: cst.Call):
    """("save", None) for `m.state_dict()`, ("load", strict Arg or None) for `m.load_state_dict(sd[, strict])`."""
    name = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
    if name == "state_dict" and not call.args:
        return "save", None
    if name == "load_state_dict":
        bound = bind(call, ("state_dict", "strict"))
        if bound is not None and "state_dict" in bound:
            return "load", bound.get("strict")
    return None


FACTS_KEY = "training.state_dicts"


class UsesStateDictPlan(RemovesStatements):
    """MF202 and MF203: both read the plan, built once the read-only pass has seen the file."""

    @property
    def plan(self) -> StateDictPlan:
        if FACTS_KEY not in self.ctx.facts:
            self.ctx.facts[FACTS_KEY] = StateDictPlan(self.ctx)
        return self.ctx.facts[FACTS_KEY]

    def collect_Call(self, node) -> None:
        super().collect_Call(node)
        self.plan.note_call(node)

    def visit_Module(self, node) -> None:
        capabilities = self.ctx.capabilities
        self.plan.build(optim_rule_selected=OPTIMIZER_STATE in capabilities, wrap_selected=FSDP2_MODELS in capabilities)


# ----- building the FSDP2 calls ----------------------------------------------------------

GATHER_HELPER_NAME = "fsdp2_full_state_dict"
ANY_MODULE_SAVE_HELPER = "fsdp2_state_dict"
ANY_MODULE_LOAD_HELPER = "fsdp2_load_state_dict"
OPTIM_LOAD_HELPER = "fsdp2_set_optimizer_state_dict"
OPTIM_LATER_HELPER = "fsdp2_optim_state_dict_to_load"
SHARDED_LOAD_HELPER = "fsdp2_load_optimizer_state"  # FSDP1's DCP resume (load_sharded_optimizer_state_dict)
# The rewrite's own calls a model is handed to in a state-dict block: none reads FSDP1's setting.
_REWRITE_HELPERS = frozenset(
    {
        RESHARD_HELPER, GATHER_HELPER_NAME, ANY_MODULE_SAVE_HELPER, ANY_MODULE_LOAD_HELPER, OPTIM_LOAD_HELPER,
        OPTIM_LATER_HELPER, SHARDED_LOAD_HELPER,
    }
)


@dataclass
class Builder:
    """Builds FSDP2 state-dict calls in the rewritten file, asking the context for imports and helpers."""

    ctx: object

    def options(self, **values) -> cst.Arg | None:
        present = {k: v for k, v in values.items() if v is not None and v is not False}
        if not present:
            return None
        options = self.ctx.require_import(DSD, "StateDictOptions")
        text = ", ".join(f"{k}={_text(v)}" for k, v in present.items())
        call = cst.parse_expression(f"{options}({text})")
        for key, value in present.items():
            if isinstance(value, cst.BaseExpression):
                call = _replace_keyword(call, key, value)
        return cst.Arg(call, keyword=cst.Name("options"), equal=_NO_SPACE_EQUAL)

    def call(self, function: str, args: list, options: cst.Arg | None) -> cst.Call:
        """`function(args, options=...)` for the statement being visited, resharded before it where it needs."""
        if function in _THROUGH_SHARDS:
            model = args[0].value if isinstance(args[0], cst.Arg) else args[0]
            reshard_before(self.ctx, model)
        return self.plain_call(function, args, options)

    def plain_call(self, function: str, args: list, options: cst.Arg | None) -> cst.Call:
        """`function(args, options=...)`, for a statement of its own that the caller places."""
        return self._call(self.ctx.require_import(DSD, function), args, options)

    def helper_call(self, helper: str, args: list, options: cst.Arg | None) -> cst.Call:
        return self._call(self.ctx.add_helper(helper), args, options)

    @staticmethod
    def _call(name: str, args: list, options: cst.Arg | None) -> cst.Call:
        all_args = [cst.Arg(a) if isinstance(a, cst.BaseExpression) else a for a in args]
        if options is not None:
            all_args.append(options)
        return cst.Call(func=cst.Name(name), args=_commas(all_args))

    def get_full(self, function: str, args: list, offload, rank0) -> cst.Call:
        """A FULL state dict with FSDP1's `offload_to_cpu` / `rank0_only` reproduced exactly (each True, False,
        or an expression read at run time, which the gathering helper takes). FSDP1's model state dict went to rank 0
        of the model's group; its optimizer state dict to the world's (the call's `group`, None, decides), as
        StateDictOptions' does."""
        own_group = rank0 and function != "get_optimizer_state_dict" and self.ctx.program.part_of_world()
        if isinstance(offload, bool) and offload is rank0 and not own_group:
            return self.call(function, args, self.options(full_state_dict=True, cpu_offload=offload))
        sharded = self.call(function, args, None)
        helper = self.ctx.add_helper(GATHER_HELPER_NAME)
        flags = [
            cst.Arg(_flag(offload), keyword=cst.Name("offload_to_cpu"), equal=_NO_SPACE_EQUAL),
            cst.Arg(_flag(rank0), keyword=cst.Name("rank0_only"), equal=_NO_SPACE_EQUAL),
        ]
        return cst.Call(func=cst.Name(helper), args=_commas([cst.Arg(sharded), *flags]))

    def get(self, function: str, args: list, kind, offload, rank0) -> cst.BaseExpression:
        if isinstance(kind, RunTimeKind):  # FULL or SHARDED, as the state-dict type read again here says
            full, sharded = self.get(function, args, FULL, offload, rank0), self.get(function, args, SHARDED, offload, rank0)
            if full.deep_equals(self.call(function, args, self.options(full_state_dict=True, cpu_offload=offload))):
                return self.call(function, args, self.options(full_state_dict=self.full_state_dict(kind), cpu_offload=offload))
            return cst.IfExp(test=self.full_state_dict(kind), body=full, orelse=sharded)
        if kind == FULL:
            return self.get_full(function, args, offload, rank0)
        return self.call(function, args, self.options(cpu_offload=offload))

    def full_state_dict(self, kind) -> bool | cst.BaseExpression:
        """StateDictOptions' `full_state_dict` for a kind: the helper's answer where it is known only at run time."""
        if isinstance(kind, RunTimeKind):
            return cst.Call(cst.Name(self.ctx.add_helper(FULL_KIND_HELPER)), [cst.Arg(kind.value.deep_clone())])
        return kind == FULL


# The calls that fail on a model a forward left unsharded (an evaluation under no_grad): see reshard.py.
_THROUGH_SHARDS = ("set_model_state_dict", "get_optimizer_state_dict", "set_optimizer_state_dict")
_NO_SPACE_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


def _single_index(subscript: cst.Subscript) -> cst.BaseExpression | None:
    """`x` of `table[x]`."""
    if len(subscript.slice) == 1 and isinstance(subscript.slice[0].slice, cst.Index):
        return subscript.slice[0].slice.value
    return None


def _is_none(node) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


# What an optimizer, a scheduler, a scaler or a data loader is called: their own state dicts, which FSDP never changed.
_NOT_A_MODEL = re.compile(r"(^|_)(optim|optimizer|optimiser|opt|scheduler|sched|scaler|sampler|loader|dataloader)s?$")


def named_as_not_a_model(node) -> bool:
    """`node` (`optimizer`, `self.lr_scheduler`) is named as an object whose state dict is its own."""
    last = node.attr.value if isinstance(node, cst.Attribute) else getattr(node, "value", None)
    return isinstance(last, str) and _NOT_A_MODEL.search(last.lower()) is not None


def _holders(model: str | None) -> set[str]:
    """`a` and `a.b` for the model `a.b.c` (and for `a.b["c"]`): objects through which other code reaches it."""
    model = model or ""
    if model.endswith("]"):  # an item of a container: the container holds it too
        base = model[: model.index("[")]
        return _holders(base) | {base}
    parts = model.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def model_key(node) -> str:
    """How a model is named: `a.b` for a name or attribute chain, `a.b["c"]` for an item taken by a string literal
    (a ModuleDict's, dinov2's `model.teacher["backbone"]`); "" otherwise."""
    if isinstance(node, cst.Subscript):
        key, base = _single_index(node), dotted(node.value)
        if isinstance(key, cst.SimpleString) and base and "[" not in base:
            return f"{base}[{key.evaluated_value!r}]"
        return ""
    return dotted(node) if isinstance(node, (cst.Name, cst.Attribute)) else ""


def _flag(value) -> cst.BaseExpression:
    return cst.Name(str(value)) if isinstance(value, bool) else value


def _text(value) -> str:
    return str(value) if isinstance(value, bool) else "None"


def _replace_keyword(call: cst.Call, key: str, value) -> cst.Call:
    args = [a.with_changes(value=value) if a.keyword is not None and a.keyword.value == key else a for a in call.args]
    return call.with_changes(args=args)


def _commas(args: list) -> list:
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    result = [a.with_changes(comma=comma) for a in args[:-1]]
    if args:
        result.append(args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return result


def _handed_on(parent, parents) -> bool:
    """The model is an argument of `function(...)`, or what the function returns: the program follows it there
    (analysis/escapes.py, factory_callers.py), and keeps the setting, and the model, FSDP1 if a state dict of it is
    read there (analysis/program.py)."""
    if isinstance(parent, cst.Return):
        return True
    return isinstance(parent, cst.Arg) and isinstance(parents[-2], cst.Call) and isinstance(parents[-2].func, cst.Name)
