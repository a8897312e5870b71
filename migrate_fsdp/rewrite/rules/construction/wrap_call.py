"""MF101: `FSDP(module, ...)` -> `fully_shard(module, ...)`, plus what its keywords need.

fully_shard applies FSDP in place and returns the module it is given
(`fully_shard` docstring), so `x = FSDP(m, ...)` becomes
`x = fully_shard(m, ...)` and `m = FSDP(m, ...)` simply `fully_shard(m, ...)`
(migration guide, seeds/002). This rule finds the constructor however it is
reached and spelt (positional or keyword arguments, `module=`, `**kwargs`
from a dict in the same scope, `functools.partial(FSDP, ...)`, manual
nesting), binds its arguments, lets one rule per keyword (MF102-MF110) say
what each means in FSDP2, and writes the result, or leaves the call and says
why. It also gives FSDP1 construction names found outside a converted call
(a `MixedPrecision` kept for another use, say) their keyword rule's advice.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.program import BLOCKED, DUAL_VERSION
from migrate_fsdp.rewrite.rule import FSDP2_MODELS, Rule
from migrate_fsdp.rewrite.rules.construction.analysis import Analysis
from migrate_fsdp.rewrite.rules.construction.arguments import Unbindable, bind
from migrate_fsdp.rewrite.rules.construction.auto_wrap_policy import AutoWrapPolicyRule
from migrate_fsdp.rewrite.rules.construction.codegen import assign, is_reevaluable, string
from migrate_fsdp.rewrite.rules.construction.cpu_offload import CpuOffloadRule
from migrate_fsdp.rewrite.rules.construction.emit import Emitter, needs_after, needs_module_again
from migrate_fsdp.rewrite.rules.construction.forward_prefetch import ForwardPrefetchRule
from migrate_fsdp.rewrite.rules.construction.ignored_modules import IgnoredModulesRule
from migrate_fsdp.rewrite.rules.construction.manual_wrap import ManualWrapRule
from migrate_fsdp.rewrite.rules.construction.mesh import MeshRule
from migrate_fsdp.rewrite.rules.construction.meta_init import MetaInitRule
from migrate_fsdp.rewrite.rules.construction.mixed_precision import MixedPrecisionRule, RunTime
from migrate_fsdp.rewrite.rules.construction.plan import CallSite, Plan, Problem, Unconvertible
from migrate_fsdp.rewrite.rules.construction.removed_kwargs import BACKWARD_PREFETCH, RemovedKwargs
from migrate_fsdp.rewrite.rules.construction.sharding_strategy import HYBRID, MEMBERS, SHARDING_STRATEGY, ShardingStrategyRule
from migrate_fsdp.rewrite.syntax import chain_root, dotted, subtree_ids, walk

FSDP_CLASS = "torch.distributed.fsdp.FullyShardedDataParallel"
PARTIAL = "functools.partial"

# In the order their `finish` runs: the mesh needs the strategy and the device.
KEYWORD_RULES = [
    AutoWrapPolicyRule,
    ShardingStrategyRule,
    MixedPrecisionRule,
    CpuOffloadRule,
    IgnoredModulesRule,
    RemovedKwargs,
    MeshRule,
    ForwardPrefetchRule,
    MetaInitRule,
    ManualWrapRule,
]

_LEFT_AS_IS = "FSDP(...) left as is: "


class WrapCall(Rule):
    code = "MF101"
    provides = frozenset({FSDP2_MODELS})
    name = "wrap-call"
    summary = "FSDP(module, ...) -> fully_shard(module, ...), in all its forms"

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.analysis = Analysis(ctx)
        self.rules = {cls.code: cls(ctx, self.analysis) for cls in KEYWORD_RULES if ctx.selected(cls.code)}
        self._by_keyword = {kw: rule for rule in self.rules.values() for kw in rule.keywords}
        self._owner = {kw: cls.code for cls in KEYWORD_RULES for kw in cls.keywords}
        self._leftovers = {name: (rule.code, text) for rule in self.rules.values() for name, text in rule.leftovers.items()}
        self._sites: list[CallSite] = []
        self._plans: dict[int, Plan] = {}
        self._kwargs_uses: set[int] = set()
        self._member_names: dict[int, str] = {}  # FSDP1 enum members in a printed kwargs dict -> their names
        self._removed: set[int] = set()  # definition statements that go
        self._dropped: dict[int, cst.CSTNode] = {}  # updated statements to take out of their block (kept alive: ids)
        self._assignments_dropped: set[int] = set()  # statements `m = FSDP(m)` that become `fully_shard(m)`
        self._roots: set[str] = set()  # local names an FSDP1 reference can start with
        self._setup_at: dict[int, list] = {}  # statement id -> setup statements shared by the calls after it
        self._redefined: dict[int, tuple] = {}  # id(assigned value) -> (plan, FSDP2 value), see Plan.redefined

    # ----- read-only pass -------------------------------------------------------------------

    def collect_Assign(self, node) -> None:
        self.analysis.note_assign(node)

    def collect_AnnAssign(self, node) -> None:
        self.analysis.note_assign(node)

    def collect_SimpleStatementLine(self, node) -> None:
        self.analysis.note_statement(node)

    def collect_If(self, node) -> None:
        self.analysis.note_statement(node)

    def collect_Import(self, node) -> None:
        for alias in node.names:
            if dotted(alias.name).startswith("torch"):
                self._roots.add(chain_root(alias.asname.name if alias.asname else alias.name))

    def collect_ImportFrom(self, node) -> None:
        if node.relative or isinstance(node.names, cst.ImportStar) or not dotted(node.module).startswith("torch.distributed"):
            return
        for alias in node.names:
            self._roots.add(dotted(alias.asname.name if alias.asname else alias.name))

    def collect_Call(self, node) -> None:
        self.analysis.note_call(node)
        if self.ctx.matches(node.func, FSDP_CLASS):
            self._sites.append(self._site(node, is_partial=False))
        elif node.args and self.ctx.matches(node.func, PARTIAL) and self.ctx.matches(node.args[0].value, FSDP_CLASS):
            self._sites.append(self._site(node, is_partial=True))
        else:
            return
        for arg in node.args:
            if arg.star == "**":
                self._kwargs_uses.add(id(arg.value))

    def _site(self, node: cst.Call, is_partial: bool) -> CallSite:
        stack = self.ctx.stack
        statement = self.ctx.statement()
        inner = stack[stack.index(statement) + 1 :]
        small = inner[0] if inner else None
        role = "nested"
        if isinstance(small, cst.Assign) and len(small.targets) == 1 and small.value is node:
            role = "assign"
        elif isinstance(small, cst.AnnAssign) and small.value is node:
            role = "assign"
        elif isinstance(small, (cst.Return, cst.Expr)) and small.value is node:
            role = "return" if isinstance(small, cst.Return) else "expr"
        return CallSite(
            node=node,
            statement=statement,
            role=role,
            can_insert=self.ctx.can_insert_statements(),
            in_lambda=any(isinstance(n, cst.Lambda) for n in inner),
            is_partial=is_partial,
            in_dual_version=self.ctx.dual_versions.holds(stack),
            stack=tuple(stack),
        )

    # ----- judging every call, before any rewriting -------------------------------------------

    def visit_Module(self, node) -> None:
        for site in self._sites:
            self.analysis.fsdp1_arguments.update(subtree_ids(site.node))
            for arg in site.node.args:
                definition = self.analysis.definitions.of(arg.value) if arg.star == "**" else None
                # A dict the program also prints stays as it is: the names in it are not the call's alone.
                if definition is not None and not self.analysis.definitions.shown(definition):
                    for value in [definition.value, *self.analysis.definitions.fill_values(definition)]:
                        self.analysis.fsdp1_arguments.update(subtree_ids(value))
        self.analysis.close_fsdp1_arguments()
        self.analysis.names.statements.update((id(site.node), site.statement) for site in self._sites)
        for site in self._sites:
            before = dict(self.ctx.imports), dict(self.ctx.helpers)
            plan = self._plan(site)
            converts = not plan.problems and not site.in_dual_version
            why = self.ctx.program.constructor(
                site.node,
                converts=converts,
                stack=site.stack,
                reads=_read_at_run_time(plan),
                part_of_world=_part_of_world(plan),
                flat_names=not self.analysis.literal_bool(plan.value("use_orig_params")),
                module=plan.module,
                keeps_parameters=plan.keeps_parameters,
                replicates=not plan.strategy.may_be(set(MEMBERS) - {"NO_SHARD"}),
            )
            if why is not None:
                plan.problems.append(Problem(site.node, BLOCKED, _LEFT_AS_IS + why))
            elif site.in_dual_version:
                plan.problems.append(Problem(site.node, DUAL_VERSION, _LEFT_AS_IS + "it serves FSDP1 beside FSDP2"))
            if plan.problems:  # nothing of a conversion that does not happen stays behind
                self.ctx.imports.clear()
                self.ctx.imports.update(before[0])
                self.ctx.helpers.clear()
                self.ctx.helpers.update(before[1])
            self._plans[id(site.node)] = plan
        # A definition converted where it stands (`mp = MixedPrecision(...)` on one branch) serves
        # every constructor using it: it converts only if none of them stays FSDP1.
        kept = {id(d.value) for plan in self._plans.values() if plan.problems for d in plan.redefined}
        for plan in self._plans.values():
            if plan.problems or any(id(d.value) in kept for d in plan.redefined):
                continue
            for definition, value in plan.redefined.items():
                self._redefined[id(definition.value)] = (plan, value)
                self._redefined[id(definition.statement)] = (plan, None)
        self._find_removed_definitions()
        self._share_setup_at_kwargs_dicts()
        self._name_members_of_shown_dicts()

    def _plan(self, site: CallSite) -> Plan:
        dicts: list = []
        try:
            arguments = bind(site.node, self.analysis.definitions, self._is_kwargs_use, skip=1 if site.is_partial else 0, dicts=dicts)
        except Unbindable as error:
            plan = Plan(site, {})
            plan.problems.append(Problem(error.node, self.code, f"{_LEFT_AS_IS}{error.message}; pass the arguments as keywords"))
            return plan
        plan = Plan(site, arguments)
        plan.definitions.extend(dicts)  # an empty `**kw` goes with the call too
        module = arguments.get("module")
        if site.is_partial and module is not None:
            self._problem(plan, module.arg, self.code, "functools.partial(FSDP, module) binds the module; call fully_shard on it directly")
        elif not site.is_partial and (module is None or module.kwargs is not None):
            self._problem(plan, site.node, self.code, "the module to wrap must be passed directly (not through **kwargs)")
        elif module is not None:
            plan.module = module.value
        for name, argument in arguments.items():
            if name == "module":
                continue
            rule = self._by_keyword.get(name)
            if rule is None:
                self._problem(plan, argument.arg, self.code, f"`{name}` is converted by {self._owner[name]}, which is not selected")
                continue
            try:
                rule.apply(argument, plan)
            except Unconvertible as error:
                self._problem(plan, error.node or argument.arg, rule.code, error.message)
        if plan.problems:
            return plan
        for rule in self.rules.values():
            try:
                rule.finish(plan)
            except Unconvertible as error:
                self._problem(plan, error.node or site.node, rule.code, error.message)
        if not plan.problems:
            self._check_placement(plan)
        return plan

    def _check_placement(self, plan: Plan) -> None:
        """The converted code must fit where the call stands."""
        site = plan.site
        after = needs_after(plan, self.rules)
        code = "MF102" if plan.has_children and "MF102" in self.rules else self.code
        if site.is_partial:
            if (plan.has_children or after) and not (site.can_insert and not site.in_lambda):
                what = "auto_wrap_policy" if plan.has_children else after[0]
                self._problem(
                    plan, site.node, code,
                    f"functools.partial(FSDP, {what}=...) becomes a function defined before this statement, which "
                    "cannot go here (one-line suite, lambda or clause); put the partial on a line of its own",
                )
            return
        needs_statements = bool(plan.before) or plan.has_children or bool(after) or plan.sharding is not None and plan.has_children
        if needs_statements and not (site.can_insert and not site.in_lambda):
            self._problem(
                plan, site.node, code,
                "the FSDP2 form needs statements around this call (mesh, loops over submodules, or setup), which "
                "cannot go here (one-line suite, lambda or clause); put the call on a line of its own",
            )
        elif after and site.role not in ("assign", "expr") and not (site.role == "return" and is_reevaluable(plan.module)):
            self._problem(plan, site.node, self.code, f"{after[0]} needs code after the call, which cannot follow it here; assign the result first")
        elif needs_module_again(plan, self.rules) and not is_reevaluable(plan.module) and site.role == "nested":
            self._problem(plan, site.node, code, "the FSDP2 form names the module several times; assign the module to a variable first")

    def _problem(self, plan: Plan, node, code: str, message: str) -> None:
        plan.problems.append(Problem(node, code, _LEFT_AS_IS + message))

    def _is_kwargs_use(self, load) -> bool:
        return id(load) in self._kwargs_uses

    def _find_removed_definitions(self) -> None:
        """Definitions (`policy = ...`, `kw = dict(...)`) that only converted calls used go with them."""
        gone: set[int] = set()
        candidates = {}
        for plan in self._plans.values():
            if plan.problems:
                continue
            gone.update(subtree_ids(plan.site.node))
            for definition in plan.definitions:
                candidates[id(definition.statement)] = definition
            for argument in plan.arguments.values():
                if argument.kwargs is not None:
                    candidates[id(argument.kwargs.statement)] = argument.kwargs
        changed = True
        while changed:
            changed = False
            for key, definition in candidates.items():
                if key not in self._removed and all(id(load) in gone for load in definition.loads):
                    self.analysis.names.released.add(definition.assignment)
                    for statement in definition.statements:  # with a kwargs dict's `kw["key"] = ...` lines
                        self._removed.add(id(statement))
                        gone.update(subtree_ids(statement))
                        self.ctx.mark_handled(statement)
                    changed = True

    def _name_members_of_shown_dicts(self) -> None:
        """A kwargs dict the program also prints stays for the print once every call it feeds converted: its
        FSDP1 members (`ShardingStrategy.HYBRID_SHARD`) become their names, which show as much and are not FSDP1's."""
        users: dict[int, tuple] = {}
        for plan in self._plans.values():
            for argument in plan.arguments.values():
                if argument.kwargs is not None:
                    users.setdefault(id(argument.kwargs.statement), (argument.kwargs, {}))[1][id(plan)] = plan
        for definition, plans in users.values():
            if any(plan.problems for plan in plans.values()) or not self.analysis.definitions.shown(definition):
                continue
            fills = getattr(definition, "fills", ())
            for statement, value in [(definition.statement, definition.value), *((f.statement, f.value) for f in fills)]:
                references = self.analysis.fsdp1_references(value)
                names = [_member_name(self.ctx, reference) for reference in references]
                if references and None not in names:
                    self._member_names.update((id(reference), name) for reference, name in zip(references, names))
                    self.ctx.mark_handled(statement)

    def _share_setup_at_kwargs_dicts(self) -> None:
        """Build the mesh once, before the `**kwargs` dict it comes from, for every call that uses the dict.

        Manual wrapping calls FSDP in a loop with the same dict; a mesh built
        at each call would create new process groups for every layer.
        """
        groups: dict[int, list] = {}
        for plan in self._plans.values():
            definition = self._setup_source(plan)
            if definition is not None:
                groups.setdefault(id(definition.statement), []).append((definition, plan))
        for items in groups.values():
            definition = items[0][0]
            plans = [plan for _, plan in items]
            setups = {tuple(self.ctx.module.code_for_node(node) for node in _setup_nodes(plan)) for plan in plans}
            if len(setups) != 1:
                continue
            first = plans[0]
            setup = list(first.before)
            values = {}
            for field, name in (("mesh", "mesh"), ("sharding", "sharding")):
                value = getattr(first, field)
                if value is not None and not isinstance(value, cst.Name):
                    var = self.analysis.names.fresh(definition.target, name, f"fsdp_{name}")
                    setup.append(assign(var, value))
                    values[field] = cst.Name(var)
            for plan in plans:
                plan.before = []
                for field, value in values.items():
                    setattr(plan, field, value)
            self._setup_at[id(self._setup_anchor(definition))] = setup

    def _setup_source(self, plan: Plan):
        """The kwargs dict all of `plan`'s mesh and device arguments come from, when its setup may go before it."""
        if plan.problems or not (plan.before or plan.mesh is not None or plan.sharding is not None):
            return None
        sources = {plan.arguments[name].kwargs for name in _SETUP_ARGUMENTS if name in plan.arguments}
        if len(sources) != 1 or None in sources:
            return None
        (definition,) = sources
        statement = definition.statement
        if id(statement) not in self.analysis.insertable or self.analysis.initialises_between(statement, plan.site.statement):
            return None
        return definition

    def _setup_anchor(self, definition):
        """Where the setup built from a kwargs dict goes: the dict's line, or, for a dict filled after it (whose
        items may name what only exists after it), the last line or `if` chain that fills it."""
        fills = getattr(definition, "fills", ())
        if not fills:
            return definition.statement
        order = self.analysis.definitions.order
        last = max(fills, key=lambda fill: order[id(fill.statement)])
        return last.chain if last.chain is not None else last.statement

    # ----- rewriting --------------------------------------------------------------------------

    def visit_SimpleStatementLine(self, node) -> None:
        plan, _ = self._redefined.get(id(node), (None, None))
        if plan is not None and not plan.problems:
            self.ctx.mark_handled(node)
        setup = self._setup_at.get(id(node))
        if setup and id(node) not in self._removed:
            self.ctx.insert_before(setup)

    def visit_Call(self, node) -> None:
        plan = self._plans.get(id(node))
        if plan is None:
            return
        for problem in plan.problems:
            self.ctx.report(problem.node, problem.code, problem.message)
        # Converted, or every reason it is not was said: the FSDP1 names inside need no catch-all.
        self.ctx.mark_handled(node)

    def leave_Call(self, original, updated):
        plan = self._plans.get(id(original))
        if plan is None or plan.problems:
            return updated
        emission = Emitter(self.analysis, self.rules, plan, updated).emit()
        for node, code, message in self._copied_leftovers(emission):  # reported now, as a second run would
            self.ctx.report(node, code, message)
        if emission.before:
            self.ctx.insert_before(emission.before)
        if emission.after:
            self.ctx.insert_after(emission.after)
        if emission.drop_target:
            self._assignments_dropped.add(id(plan.site.statement))
        return emission.replacement

    def _copied_leftovers(self, emission) -> list[tuple[cst.CSTNode, str, str]]:
        """(node, code, message) for each FSDP1 name the converted code copies from the user's (the test of an `if`
        filling the call's kwargs: `device_mesh if strategy in (ShardingStrategy.HYBRID_SHARD, ...) else None`)."""
        roots = [node for node in (*emission.before, emission.replacement, *emission.after) if node is not None]
        found = []
        for node, parents in walk(*roots):
            if isinstance(node, (cst.Name, cst.Attribute)) and not (parents and isinstance(parents[-1], cst.Attribute)):
                for qualified in sorted(self.ctx.fsdp1_names(node)):
                    leftover = self._leftovers.get(qualified) or self._leftovers.get(qualified.rpartition(".")[0])
                    if leftover:
                        found.append((node, *leftover))
                        break
        return found

    def leave_Attribute(self, original, updated):
        name = self._member_names.get(id(original))
        return updated if name is None else string(name)

    def leave_Assign(self, original, updated):
        plan, value = self._redefined.get(id(original.value), (None, None))
        if plan is not None and not plan.problems:
            return updated.with_changes(value=value)
        return self._drop_target(original, updated)

    def leave_AnnAssign(self, original, updated):
        plan, value = self._redefined.get(id(original.value), (None, None)) if original.value is not None else (None, None)
        if plan is not None and not plan.problems:
            return updated.with_changes(value=value)
        return self._drop_target(original, updated)

    def _drop_target(self, original, updated):
        statement = self.ctx.statement()
        if id(statement) in self._assignments_dropped and original.value is not None and id(original.value) in self._plans:
            return cst.Expr(value=updated.value, semicolon=updated.semicolon)
        return updated

    def leave_SimpleStatementLine(self, original, updated):
        if id(original) not in self._removed:
            return updated
        setup = self._setup_at.get(id(original))
        if setup:  # the definition makes way for the setup built from it
            return _in_place_of(updated, setup)
        self._dropped[id(updated)] = updated
        return updated

    def leave_FunctionDef(self, original, updated):
        if id(original) in self._removed:  # a param_init_fn only converted calls read
            self._dropped[id(updated)] = updated
        return updated

    def leave_If(self, original, updated):
        setup = self._setup_at.get(id(original))
        if setup and id(original) in self._removed:  # the last `if` filling the dict makes way for the setup
            return _in_place_of(updated, setup)
        if setup:
            return cst.FlattenSentinel([updated, *setup])
        if id(original) in self._removed:  # an `if` that only filled a removed kwargs dict
            self._dropped[id(updated)] = updated
        # Branches that only filled it are left empty, and go as dead blocks (imports.finish_module).
        return updated

    def leave_IndentedBlock(self, original, updated):
        return self._without_removed(updated)

    def leave_Module(self, original, updated):
        return self._without_removed(updated)

    def _without_removed(self, block):
        """`block` without the removed definitions; their comments move to the next statement."""
        if not any(id(statement) in self._dropped for statement in block.body):
            return block
        body, pending = [], []
        for statement in block.body:
            if id(statement) in self._dropped:
                pending += [line for line in statement.leading_lines if line.comment is not None]
                continue
            if pending:
                lines = list(statement.leading_lines)
                blanks = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
                # After the blank lines that set the statement apart, before its own comments: in source order.
                statement = statement.with_changes(leading_lines=[*lines[:blanks], *pending, *lines[blanks:]])
                pending = []
            body.append(statement)
        changes = {"body": body}  # an emptied block goes whole with its statement later (imports.finish_module)
        if pending:
            changes["footer"] = [*block.footer, *pending]
        return block.with_changes(**changes)

    # ----- FSDP1 construction names outside converted calls --------------------------------------

    def visit_Name(self, node) -> None:
        self._leftover(node)

    def visit_Attribute(self, node) -> None:
        self._leftover(node)

    def _leftover(self, node) -> None:
        if chain_root(node) not in self._roots:
            return
        parent = self.ctx.stack[-2] if len(self.ctx.stack) > 1 else None
        if isinstance(parent, cst.Attribute):
            return  # only the outermost node of a chain
        if any(isinstance(n, (cst.Import, cst.ImportFrom)) for n in self.ctx.stack):
            return
        for qualified in sorted(self.ctx.fsdp1_names(node)):
            found = self._leftovers.get(qualified) or self._leftovers.get(qualified.rpartition(".")[0])
            if found and not self.ctx.is_covered([id(n) for n in self.ctx.stack]):
                code, message = found
                # A call of it is reported whole: its arguments (`wrapper_cls=FSDP`) belong to the same advice.
                called = isinstance(parent, cst.Call) and parent.func is node
                self.ctx.report(parent if called else node, code, message)
                return


def _read_at_run_time(plan: Plan) -> frozenset:
    """The keywords whose values the converted call hands to a helper that takes their FSDP1 or FSDP2 form."""
    reads = set()
    if isinstance(plan.mixed_precision, RunTime):
        reads.add("mixed_precision")
    if plan.policy is not None and plan.policy.runtime is not None:
        reads.add("auto_wrap_policy")
    if plan.strategy.runtime is not None:  # the sharding helpers take a member or its name
        reads.add("sharding_strategy")
    return frozenset(reads)


def _part_of_world(plan: Plan) -> bool:
    """Whether the model may be sharded over some ranks only (a process group or mesh of the user's, HYBRID_SHARD,
    NO_SHARD), where FSDP1's rank 0 (of that group) is not the world's."""
    return plan.process_group is not None or plan.device_mesh is not None or plan.strategy.may_be({*HYBRID, "NO_SHARD"})


# The arguments the mesh and the device setup are built from.
_SETUP_ARGUMENTS = ("sharding_strategy", "process_group", "device_mesh", "device_id")


def _setup_nodes(plan: Plan) -> list:
    return [*plan.before, *(node for node in (plan.mesh, plan.sharding) if node is not None)]


def _in_place_of(statement, setup: list) -> cst.FlattenSentinel:
    """`setup` where `statement` stood, under the comments above it."""
    comments = [line for line in statement.leading_lines if line.comment is not None]
    return cst.FlattenSentinel([setup[0].with_changes(leading_lines=[*comments, *setup[0].leading_lines]), *setup[1:]])


def _member_name(ctx, reference) -> str | None:
    """"HYBRID_SHARD" for a ShardingStrategy or BackwardPrefetch member, however spelt; None otherwise."""
    for name in ctx.qualified_names(reference):
        head, _, member = name.rpartition(".")
        if head in (SHARDING_STRATEGY, BACKWARD_PREFETCH):
            return member
    return None
