"""Writing out a Plan: the statements before the call, the fully_shard call itself, the statements after.

The order matters and is FSDP1's: the device is made current and the mesh
built first; rank 0's weights are taken before anything is sharded; the
auto-wrapped children are sharded before the root (a parent sharded first
would take its children's parameters); what FSDP1 did once the model existed
(loading rank 0's weights, casting buffers, prefetch order) comes after.
"""

from dataclasses import dataclass, field

import libcst as cst

from migrate_fsdp.rewrite.layout import BLACK_LINE
from migrate_fsdp.rewrite.rules.construction.codegen import assign, call, expression, is_reevaluable, keyword, statements, with_commas
from migrate_fsdp.rewrite.rules.construction.mixed_precision import CAST_BUFFERS_HELPER, RunTime
from migrate_fsdp.rewrite.rules.construction.plan import Initialiser, ParamInit

INIT_HELPER = "fsdp1_param_init"  # an initialising param_init_fn, run before each fully_shard call
# fully_shard's keyword order.
_ORDER = ("mesh", "reshard_after_forward", "mp_policy", "offload_policy", "ignored_params")


@dataclass
class Emission:
    before: list[cst.BaseStatement] = field(default_factory=list)
    replacement: cst.BaseExpression | None = None  # what the FSDP1 call becomes in its statement
    after: list[cst.BaseStatement] = field(default_factory=list)
    drop_target: bool = False  # `m = FSDP(m, ...)` -> `fully_shard(m, ...)`


def needs_module_again(plan, rules) -> bool:
    """Whether the converted code names the module more than once (loops, or statements after the call)."""
    return plan.has_children or bool(needs_after(plan, rules))


def needs_after(plan, rules) -> list[str]:
    """What must run after the root is sharded, by FSDP1 argument."""
    reasons = []
    if plan.sync_module_states and not plan.syncs_each_unit:
        reasons.append("sync_module_states")
    elif isinstance(plan.param_init, ParamInit):
        reasons.append("param_init_fn")
    if plan.mixed_precision is not None and rules["MF104"].buffer_dtype(plan.mixed_precision) is not None:
        reasons.append("mixed_precision's buffer_dtype")
    if plan.forward_prefetch:
        reasons.append("forward_prefetch")
    if plan.parameter_tags:
        reasons.append("use_orig_params's parameter attributes")
    return reasons


_MESHES = "construction.meshes"  # ctx.facts key: block id -> {mesh variable made there: the code of the mesh it holds}


class Emitter:
    def __init__(self, analysis, rules: dict, plan, call_node: cst.Call) -> None:
        self.ctx = analysis.ctx
        self.names = analysis.names
        self.rules = rules  # selected keyword rules by code
        self.plan = plan
        self.call = call_node  # the updated call
        self.anchor = plan.site.node
        self.statements_allowed = plan.site.can_insert and not plan.site.in_lambda
        self.mixed_precision = plan.mixed_precision  # as the statements read it (a variable, once bound)
        self.param_init_fn = plan.param_init.function if isinstance(plan.param_init, Initialiser) else None

    def _updated(self, original_arg: cst.Arg) -> cst.Arg:
        """The updated version of one of the original call's arguments."""
        index = next(i for i, arg in enumerate(self.plan.site.node.args) if arg is original_arg)
        return self.call.args[index]

    def _variable(self, prefix: list, name: str, value, *fallbacks: str) -> cst.Name:
        var = self.names.fresh(self.anchor, name, *fallbacks)
        prefix.append(assign(var, value))
        return cst.Name(var)

    def emit(self) -> Emission:
        plan, rules = self.plan, self.rules
        emission = Emission()
        fully_shard = self.ctx.require_import("torch.distributed.fsdp", "fully_shard")
        setup = list(plan.before)
        if plan.site.is_partial:
            # At import no process group exists yet: a mesh or a sharding helper there would fail before training.
            at_import = not any(isinstance(n, (cst.FunctionDef, cst.Lambda)) for n in plan.site.stack)
            deferred = at_import and bool(setup or plan.mesh is not None or plan.sharding is not None)
            if plan.has_children or needs_after(plan, rules) or deferred or self.param_init_fn is not None:
                return self._partial_function(fully_shard, setup, deferred)
            emission.before = setup
            emission.replacement = self._partial(fully_shard, setup)
            return emission

        module_arg = self._updated(plan.arguments["module"].arg)
        module = module_arg.value
        hoisted = False
        if needs_module_again(plan, rules) and not is_reevaluable(module):
            if plan.site.role == "assign" and is_reevaluable(plan.site.target):
                hoisted, module = True, plan.site.target.deep_clone()
                emission.replacement = module_arg.value
            else:
                module = self._variable(setup, "model", module_arg.value, "fsdp_model")
            module_arg = module_arg.with_changes(value=module)

        root, sharding, after = self._shard(fully_shard, module, setup, setup)
        root_call = self._root_call(fully_shard, module_arg, root, sharding)
        root_statement = cst.SimpleStatementLine([cst.Expr(root_call)])
        if hoisted:
            emission.after = [*setup, root_statement, *after]
            return emission
        if after and plan.site.role == "return":  # `return FSDP(m, ...)`: shard, finish, then return the module
            emission.before, emission.replacement = [*setup, root_statement, *after], module
            return emission
        emission.before, emission.replacement, emission.after = setup, root_call, after
        target = plan.site.target
        emission.drop_target = target is not None and self.ctx.code(target) == self.ctx.code(plan.arguments["module"].value)
        return emission

    def _shard(self, fully_shard: str, module, setup: list, per_call: list) -> tuple[dict, cst.BaseExpression | None, list]:
        """The root's fully_shard keywords, the `**` sharding mapping, and the statements after the root.

        What every call may share (the mesh, the policies) goes to `setup`;
        what each sharded module needs (rank 0's weights, the loop over its
        children) to `per_call`.
        """
        plan, rules = self.plan, self.rules
        shared = self._shared_kwargs(setup)
        skip = None
        if plan.ignored is not None:
            skip = self._ignored(per_call, shared, module)
        mp = rules.get("MF104")
        settings = self.mixed_precision
        if isinstance(settings, RunTime) and self.statements_allowed:  # converted once, read by every statement
            settings = self.mixed_precision = RunTime(self._variable(setup, "mixed_precision", settings.converted, "fsdp_mixed_precision"))
        root_policy = mp.policy(settings, root=not plan.site.placed_in_parent) if settings else None
        sharding = plan.sharding
        written_over_lines = sharding is not None and "\n" in self.ctx.code(sharding)  # a table the user laid out
        if sharding is not None and (plan.has_children or written_over_lines) and self.statements_allowed and not isinstance(sharding, cst.Name):
            sharding = self._variable(setup, "sharding", sharding, "fsdp_sharding")
        if plan.sync_module_states and not plan.syncs_each_unit:
            full_state_dict = self.names.fresh(self.anchor, "full_state_dict", "fsdp1_full_state_dict")
            per_call += rules["MF110"].before(plan, module, full_state_dict)
        if self.param_init_fn is not None and plan.has_children:
            if not is_reevaluable(self.param_init_fn):
                self.param_init_fn = self._variable(setup, "param_init_fn", self.param_init_fn, "fsdp1_param_init_fn")
            if plan.syncs_each_unit and plan.device is not None and not is_reevaluable(plan.device):
                plan.device = self._variable(setup, "device", plan.device, "fsdp_device")

        per_call += self._buffer_cast(module, skip)
        if plan.parameter_tags:
            per_call += rules["MF108"].tags_taken(plan, module, self._tags())
        if plan.has_children:
            child = dict(shared)
            if settings is not None:
                child_policy = mp.policy(settings, root=False)
                reread = isinstance(settings, RunTime)  # an attribute of the converted settings
                child["mp_policy"] = child_policy if reread else self._variable(setup, "mp_policy", child_policy, "fsdp_mp_policy")
                if self.ctx.module.code_for_node(child_policy) == self.ctx.module.code_for_node(root_policy):
                    root_policy = child["mp_policy"]
            for name in ("offload_policy", "reshard_after_forward"):  # every call reads them: evaluated once
                if name in child and not isinstance(child[name], cst.Name):
                    child[name] = shared[name] = self._variable(setup, name, child[name], f"fsdp_{name}")
            hints = [hint for hint in (plan.policy.var_hint, "module", "submodule") if hint != self.ctx.code(module)]
            var = cst.Name(self.names.fresh(self.anchor, *hints))
            full_precision = None
            classes = mp.full_precision_classes(settings, self.anchor) if settings else None
            if classes is not None:
                precise = {**child, "mp_policy": mp.full_precision_policy(settings, self.anchor)}
                full_precision = (classes, self._fully_shard(fully_shard, var, precise, sharding))
            loop = rules["MF102"].loop(plan, module, var, self._fully_shard(fully_shard, var, child, sharding), full_precision, skip)
            comments = self._comments_of(plan.arguments["auto_wrap_policy"].arg)
            loop[0] = loop[0].with_changes(leading_lines=[*comments, *loop[0].leading_lines])
            per_call += loop

        root = dict(shared)
        if root_policy is not None:
            root["mp_policy"] = root_policy
        return root, sharding, self._after(module, skip)

    def _partial_function(self, fully_shard: str, setup: list, deferred: bool) -> Emission:
        """`functools.partial(FSDP, ...)` whose FSDP2 form needs statements: a function of the module doing them.

        It is called as the partial was (`wrapper(model)`) and returns the
        module, as FSDP(...) returned the wrapped one; the mesh and the
        policies are built once, where the partial was, unless `deferred`: a
        partial made at import builds them in the function, when the process
        group exists.
        """
        name = self.names.fresh(self.anchor, "fsdp_wrap", "fully_shard_wrapper")
        module = cst.Name("module")
        body = []
        if deferred:
            body, setup = setup, []
        root, sharding, after = self._shard(fully_shard, module, body if deferred else setup, body)
        body += [cst.SimpleStatementLine([cst.Expr(self._fully_shard(fully_shard, module, root, sharding))]), *after]
        body.append(cst.SimpleStatementLine([cst.Return(module)]))
        comment = cst.EmptyLine(comment=cst.Comment("# FSDP1's functools.partial(FSDP, ...): shards `module` as those arguments did"))
        function = cst.FunctionDef(
            name=cst.Name(name),
            params=cst.Parameters([cst.Param(module)]),
            body=cst.IndentedBlock(body),
            leading_lines=[comment],
        )
        return Emission(before=[*setup, function], replacement=cst.Name(name))

    # ----- pieces -------------------------------------------------------------------------------

    def _shared_kwargs(self, setup: list) -> dict:
        """The keyword arguments every fully_shard call of this conversion gets."""
        plan = self.plan
        shared = {name: value for name, (value, _) in plan.kwargs.items()}
        if plan.mesh is not None:
            if self.statements_allowed and not isinstance(plan.mesh, cst.Name):
                shared["mesh"] = self._mesh(setup)
            else:
                shared["mesh"] = plan.mesh
        return shared

    def _mesh(self, setup: list) -> cst.Name:
        """The mesh's variable: one made for an earlier call of the same block, over the same devices, is the same
        mesh (two models sharded side by side need no second `init_device_mesh`)."""
        plan = self.plan
        block = next((n for n in reversed(plan.site.stack) if isinstance(n, (cst.IndentedBlock, cst.Module))), None)
        if plan.site.is_partial or block is None:
            return self._variable(setup, "mesh", plan.mesh, "fsdp_mesh")
        holding = self.ctx.facts.setdefault(_MESHES, {}).setdefault(id(block), {})  # variable -> its mesh's code
        code = self.ctx.code(plan.mesh)
        made = next((variable for variable, held in holding.items() if held == code), None)
        if made is not None:
            return cst.Name(made)  # still holding that mesh: no later mesh of this block took its name
        variable = self._variable(setup, "mesh", plan.mesh, "fsdp_mesh")
        holding[variable.value] = code
        return variable

    def _ignored(self, setup: list, shared: dict, module) -> tuple | None:
        """ignored_params for every call; (ignored modules, ignored params) variables when loops need them."""
        rule = self.rules["MF107"]
        ignored = self.plan.ignored
        if not (self.plan.has_children or needs_after(self.plan, self.rules)):
            shared["ignored_params"] = rule.params(ignored, self.anchor)
            return None
        modules = self._variable(setup, "ignored_modules", rule.modules(ignored, self.anchor), "fsdp_ignored_modules")
        params = self._variable(setup, "ignored_params", rule.params(ignored, self.anchor, modules), "fsdp_ignored_params")
        shared["ignored_params"] = params
        return modules, params

    def _after(self, module, skip) -> list[cst.BaseStatement]:
        plan, rules = self.plan, self.rules
        after = []
        if plan.sync_module_states and not plan.syncs_each_unit:
            full_state_dict = self.names.fresh(self.anchor, "full_state_dict", "fsdp1_full_state_dict")
            buffer = self.names.fresh(self.anchor, "buffer", "fsdp_buffer")
            after += rules["MF110"].after(plan, module, full_state_dict, buffer)
        elif isinstance(plan.param_init, ParamInit):
            after += rules["MF110"].materialise(plan, module)
        if plan.forward_prefetch:
            after += rules["MF109"].statements(plan, module)
        if plan.parameter_tags:
            after += rules["MF108"].tags_restored(plan, module, self._tags())
        return after

    def _tags(self) -> str:
        return self.names.fresh(self.anchor, "parameter_attributes", "fsdp1_parameter_attributes")

    def _buffer_cast(self, module, skip) -> list[cst.BaseStatement]:
        """The statements casting buffers as FSDP1's buffer_dtype did, when the settings have one."""
        settings, mp = self.mixed_precision, self.rules["MF104"]
        dtype = mp.buffer_dtype(settings) if settings is not None else None
        if dtype is None:
            return []
        if mp.may_skip_buffer_cast(settings):
            cast = self._cast_buffers(module, dtype, skip)
            return [cst.If(test=expression("DTYPE is not None", DTYPE=dtype), body=cst.IndentedBlock(cast))]
        if isinstance(dtype, cst.IfExp):  # chosen at run time, None where no cast is needed
            var = self.names.fresh(self.anchor, "buffer_dtype", "fsdp_buffer_dtype")
            cast = self._cast_buffers(module, cst.Name(var), skip)
            return [assign(var, dtype), cst.If(test=expression(f"{var} is not None"), body=cst.IndentedBlock(cast))]
        return self._cast_buffers(module, dtype, skip)

    def _cast_buffers(self, module, dtype, skip) -> list[cst.BaseStatement]:
        """FSDP1 cast the floating buffers of each unit to its buffer_dtype, except in full-precision and ignored
        modules; done before sharding, where the units earlier calls made are the FSDP modules already there."""
        mp = self.rules["MF104"]
        classes = mp.full_precision_classes(self.mixed_precision, self.anchor) if self.plan.has_children else None
        helper = self.ctx.add_helper(CAST_BUFFERS_HELPER)
        arguments = "M, DTYPE" + (", FP" if classes is not None or skip else "") + (", SKIP" if skip else "")
        return statements(
            f"{helper}({arguments})",
            M=module,
            DTYPE=dtype,
            FP=classes if classes is not None else cst.Tuple([]),
            SKIP=skip[0] if skip else None,
        )

    def _initialised(self, module: cst.BaseExpression) -> cst.BaseExpression:
        """`module`, or `fsdp1_param_init(module, fn)`: an initialising param_init_fn runs on it before sharding (and
        rank 0's weights are broadcast over it, moved to FSDP1's device first, with sync_module_states)."""
        if self.param_init_fn is None:
            return module
        plan = self.plan
        if not plan.syncs_each_unit:
            return call(self.ctx.add_helper(INIT_HELPER), module, self.param_init_fn)
        sync = {"sync_module_states": plan.sync_module_states if plan.sync_module_states is not True else cst.Name("True")}
        device = {} if plan.device is None else {"device": plan.device}
        group = {} if plan.process_group is None else {"process_group": plan.process_group}
        return call(self.ctx.add_helper(INIT_HELPER), module, self.param_init_fn, **sync, **device, **group)

    def _fully_shard(self, fully_shard: str, module, kwargs: dict, sharding) -> cst.Call:
        node = call(fully_shard, self._initialised(module), **_ordered(kwargs))
        if sharding is not None:
            node = node.with_changes(args=with_commas([*node.args, cst.Arg(star="**", value=sharding)]))
        return node

    def _root_call(self, fully_shard: str, module_arg: cst.Arg, kwargs: dict, sharding) -> cst.Call:
        """The root's fully_shard call, laid out like the FSDP1 call (one argument a line stays so)."""
        module_arg = module_arg.with_changes(value=self._initialised(module_arg.value))
        new_args = [module_arg] + [keyword(name, value) for name, value in _ordered(kwargs).items()]
        if sharding is not None:
            new_args.append(cst.Arg(star="**", value=sharding))
        return self._relaid(self.call.with_changes(func=cst.Name(fully_shard)), new_args)

    def _partial(self, fully_shard: str, setup: list) -> cst.Call:
        shared = self._shared_kwargs(setup)
        if self.plan.ignored is not None:
            shared["ignored_params"] = self.rules["MF107"].params(self.plan.ignored, self.anchor)
        if self.plan.mixed_precision is not None:
            shared["mp_policy"] = self.rules["MF104"].policy(self.plan.mixed_precision, root=True)
        first = self.call.args[0].with_changes(value=cst.Name(fully_shard))
        new_args = [first] + [keyword(name, value) for name, value in _ordered(shared).items()]
        if self.plan.sharding is not None:
            new_args.append(cst.Arg(star="**", value=self.plan.sharding))
        return self._relaid(self.call, new_args)

    def _source(self, name: str) -> cst.Arg | None:
        """The (updated) FSDP1 argument a fully_shard keyword replaces, if one does."""
        arguments = self.plan.arguments
        if name in self.plan.kwargs:
            source = self.plan.kwargs[name][1]
        else:
            owners = {"mesh": ("device_mesh", "process_group"), "mp_policy": ("mixed_precision",), "ignored_params": ("ignored_modules", "ignored_states")}
            source = next((arguments[o].arg for o in owners.get(name, ()) if o in arguments), None)
        return None if source is None or source.star else self._updated(source)

    def _relaid(self, call_node: cst.Call, new_args: list[cst.Arg]) -> cst.Call:
        """`call_node` with `new_args`, separated as its old arguments were, their comments kept."""
        old = list(self.call.args)
        if len(new_args) == 1:
            if len(old) == 1:  # nothing dropped: the layout stays as it was
                return call_node.with_changes(args=[old[0].with_changes(value=new_args[0].value)])
            only = new_args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace(""))
            return call_node.with_changes(args=[only], whitespace_before_args=cst.SimpleWhitespace(""))
        breaks = [a.comma.whitespace_after for a in old if isinstance(a.comma, cst.Comma) and isinstance(a.comma.whitespace_after, cst.ParenthesizedWhitespace)]
        if not breaks:
            laid = with_commas(new_args)
            laid[-1] = laid[-1].with_changes(whitespace_after_arg=old[-1].whitespace_after_arg)
            return call_node.with_changes(args=laid)
        one_line = self._one_line(call_node, new_args)
        if one_line is not None and not any(_line_end(a) or _lines_above(old, a) for a in old):
            return one_line  # short, and no comment to keep in place: as black writes it
        sources = [old[0]] + [self._source(arg.keyword.value) if arg.keyword else None for arg in new_args[1:]]
        laid = []
        for index, (arg, source) in enumerate(zip(new_args, sources)):
            line_end = _line_end(source) or cst.TrailingWhitespace()
            if index < len(new_args) - 1:
                above_next = _lines_above(old, sources[index + 1])
                after = breaks[0].with_changes(first_line=line_end, empty_lines=above_next)
                laid.append(arg.with_changes(comma=cst.Comma(whitespace_after=after), whitespace_after_arg=cst.SimpleWhitespace("")))
                continue
            closing_comma, closing_space = old[-1].comma, old[-1].whitespace_after_arg
            if isinstance(closing_comma, cst.Comma) and isinstance(closing_comma.whitespace_after, cst.ParenthesizedWhitespace):
                closing_comma = closing_comma.with_changes(whitespace_after=closing_comma.whitespace_after.with_changes(first_line=line_end))
            elif isinstance(closing_space, cst.ParenthesizedWhitespace):
                closing_space = closing_space.with_changes(first_line=line_end)
            laid.append(arg.with_changes(comma=closing_comma, whitespace_after_arg=closing_space))
        return call_node.with_changes(args=laid)

    def _one_line(self, call_node: cst.Call, new_args: list[cst.Arg]) -> cst.Call | None:
        """`call_node` with `new_args` on one line, if that fits black's line where the FSDP1 call started."""
        laid = with_commas(new_args)
        laid[-1] = laid[-1].with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
        one_line = call_node.with_changes(args=laid, whitespace_before_args=cst.SimpleWhitespace(""))
        code = cst.Module([]).code_for_node(one_line)
        opening = call_node.whitespace_before_args
        if "\n" in code or "#" in code or getattr(opening, "first_line", cst.TrailingWhitespace()).comment:
            return None
        return one_line if self.ctx.position(self.anchor)[1] - 1 + len(code) <= BLACK_LINE else None

    def _comments_of(self, original_arg: cst.Arg) -> list[cst.EmptyLine]:
        """The comment lines above an argument of the FSDP1 call and the comment ending its line."""
        arg = self._updated(original_arg)
        comments = [line.comment for line in _lines_above(list(self.call.args), arg)]
        line_end = _line_end(arg)
        if line_end is not None:
            comments.append(line_end.comment)
        return [cst.EmptyLine(comment=comment) for comment in comments]


def _lines_above(args: list[cst.Arg], arg: cst.Arg | None) -> list[cst.EmptyLine]:
    """The comment lines between `arg` and the argument before it."""
    index = next((i for i, a in enumerate(args) if a is arg), 0)
    if index == 0:
        return []
    space = args[index - 1].comma.whitespace_after if isinstance(args[index - 1].comma, cst.Comma) else None
    if not isinstance(space, cst.ParenthesizedWhitespace):
        return []
    return [line for line in space.empty_lines if line.comment is not None]


def _line_end(arg: cst.Arg | None) -> cst.TrailingWhitespace | None:
    """The end of the line `arg` stands on, with its comment, when the argument ends a line."""
    if arg is None:
        return None
    space = arg.comma.whitespace_after if isinstance(arg.comma, cst.Comma) else arg.whitespace_after_arg
    if isinstance(space, cst.ParenthesizedWhitespace) and space.first_line.comment is not None:
        return space.first_line
    return None


def _ordered(kwargs: dict) -> dict:
    """In fully_shard's order; a keyword's value needs no parentheses (`mp_policy=a if c else b`)."""
    return {name: kwargs[name] for name in _ORDER if name in kwargs}
