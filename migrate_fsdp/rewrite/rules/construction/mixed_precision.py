"""MF104: `mixed_precision=MixedPrecision(...)` -> `mp_policy=MixedPrecisionPolicy(...)`.

Field by field (FSDP1 `MixedPrecision` and FSDP2 `MixedPrecisionPolicy`
docstrings, migration guide in seeds/002):

- param_dtype, reduce_dtype: the same meaning, and both default reduce_dtype
  to param_dtype.
- cast_root_forward_inputs / cast_forward_inputs: FSDP1's root casts its
  inputs when either is set, other FSDP modules only with
  cast_forward_inputs (default False); FSDP2 has one per-module flag. The
  root gets `cast_root or cast`, auto-wrapped children get `cast`, so where
  the root and the children are known (an auto_wrap_policy) the cast happens
  where it did. A lone FSDP(...) call is converted as a root.
- buffer_dtype: FSDP2 does not cast buffers, FSDP1 cast them to buffer_dtype
  at the first forward (except in modules that run in full precision, below)
  and kept them so: the rewrite casts them right after sharding. Still lossy:
  FSDP1 saved those buffers in their original dtype in full state dicts.
- _module_classes_to_ignore (default `_BatchNorm`): with an auto_wrap_policy
  FSDP1 also wrapped every such module on its own, in full precision, casting
  its inputs to float32 and its outputs back (`_wrap_utils._auto_wrap`,
  `_override_module_mixed_precision`); the rewrite shards them separately with
  a float32 policy whose output_dtype is param_dtype.
- keep_low_precision_grads=True has no FSDP2 form (FSDP2 keeps gradients in the
  parameters' dtype): reported.

A value the rewrite cannot read (a MixedPrecision returned by a function of
another module, a parameter) goes through the `_fsdp1_mixed_precision` helper
at run time, which gives each of the policies above from the object's fields
(and refuses keep_low_precision_grads=True when it runs); the FSDP1 object
stays the user's configuration and never reaches fully_shard.
"""

from dataclasses import dataclass, field

import libcst as cst

from migrate_fsdp.rewrite.rules.construction import choice
from migrate_fsdp.rewrite.rules.construction.codegen import call, expression, grouped, is_lookup, string
from migrate_fsdp.rewrite.rules.construction.plan import KeywordRule, Unconvertible

MIXED_PRECISION = "torch.distributed.fsdp.MixedPrecision"
CAST_BUFFERS_HELPER = "fsdp2_cast_buffers"  # FSDP1's buffer_dtype, which fully_shard does not apply
POLICY = ("torch.distributed.fsdp", "MixedPrecisionPolicy")
FIELDS = (
    "param_dtype",
    "reduce_dtype",
    "buffer_dtype",
    "keep_low_precision_grads",
    "cast_forward_inputs",
    "cast_root_forward_inputs",
    "_module_classes_to_ignore",
)
BATCH_NORM = "torch.nn.modules.batchnorm._BatchNorm"
HELPER = "_fsdp1_mixed_precision"


@dataclass
class Settings:
    values: dict[str, cst.BaseExpression] = field(default_factory=dict)
    cast: bool = False  # cast_forward_inputs
    cast_root: bool = True  # cast_root_forward_inputs

    def dtype(self, name: str) -> cst.BaseExpression | None:
        value = self.values.get(name)
        return None if value is None or (isinstance(value, cst.Name) and value.value == "None") else value


@dataclass(frozen=True, eq=False)
class Assigned:
    """A variable set on several branches (`mp = None` / `if cfg.bf16: mp = MixedPrecision(...)`).

    Each assignment becomes the root's MixedPrecisionPolicy where it stands
    (None stays None); the children's policies are derived from the variable.
    """

    name: cst.Name
    settings: list[Settings]  # the MixedPrecision values it may hold
    maybe_none: bool
    redefined: tuple = ()  # its assignments that change where they stand (Plan.redefined)


@dataclass(frozen=True, eq=False)
class RunTime:
    """A mixed_precision known only at run time (`mp if not cfg.pure_bf16 else None`, `mp` from elsewhere).

    `converted` is `_fsdp1_mixed_precision(value)` (or a variable holding it),
    a dict of the root's and the children's policies, the full-precision
    classes and policy, and the buffer dtype (None: no cast).
    """

    converted: cst.BaseExpression

    def field(self, name: str) -> cst.BaseExpression:
        return cst.Subscript(grouped(self.converted), [cst.SubscriptElement(cst.Index(string(name)))])


@dataclass(frozen=True, eq=False)
class _Unknown:
    """A branch the rewrite cannot read (`source` as written); `why` it is not converted statically."""

    source: cst.BaseExpression
    why: str


class MixedPrecisionRule(KeywordRule):
    code = "MF104"
    name = "mixed-precision"
    summary = "mixed_precision=MixedPrecision(...) -> mp_policy=MixedPrecisionPolicy(...)"
    keywords = ("mixed_precision",)
    leftovers = {
        MIXED_PRECISION: (
            "MixedPrecision is FSDP1's; FSDP2 takes fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype=..., "
            "reduce_dtype=...)); where a converted call reads it, _fsdp1_mixed_precision converts it at run time, "
            "see docs/rules/MF104.md"
        )
    }

    def apply(self, argument, plan) -> None:
        definitions = self.analysis.assigned_on_branches(argument.value, plan)
        if definitions is not None:
            plan.mixed_precision = self._assigned(argument, definitions, plan)
            return
        followed = len(plan.definitions)
        follow = lambda node: self.analysis.follow(node, plan)[0]
        tree = choice.resolve(argument.value, lambda value, source: self._branch(value, source, argument), follow)
        branches = choice.leaves(tree)
        unknown = [branch for branch in branches if isinstance(branch, _Unknown)]
        if unknown:
            plan.mixed_precision = self._run_time(argument, unknown, branches, plan.site)
            del plan.definitions[followed:]  # the value stays as written: the helper reads it
            return
        if all(settings is None for settings in branches):
            return
        if isinstance(tree, Settings):
            self._bind_dtypes(tree, plan)
        plan.mixed_precision = tree

    def _bind_dtypes(self, settings: Settings, plan) -> None:
        """A dtype computed at the call (`{"bf16": torch.bfloat16, ...}[args.precision]`) is bound to a variable
        first: the root's, the children's and the full-precision policies all read it, once, as FSDP1 did."""
        for name in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            value = settings.dtype(name)
            if value is not None:
                settings.values[name] = self.analysis.read_once(value, plan, name, f"fsdp_{name}")

    def _run_time(self, argument, unknown: list, branches: list, site) -> RunTime:
        """Converted by the helper at run time, once, into a variable every call reads (`get_policy(cfg)` is
        called once, as FSDP1 did), or where no statement can go, when every branch is None or a value read
        again as it is written."""
        once = site.can_insert and not site.in_lambda
        for branch in unknown:
            if not (once or is_lookup(branch.source)):
                self._refuse(branch, argument)
        if any(isinstance(branch, Settings) for branch in branches):  # the MixedPrecision(...) written here would stay FSDP1
            self._refuse(unknown[0], argument)
        value = argument.value.with_changes(lpar=[], rpar=[])  # the call's own parentheses hold it
        return RunTime(call(self.ctx.add_helper(HELPER), value))

    def _refuse(self, branch: _Unknown, argument):
        shown = self.ctx.code(branch.source)
        raise Unconvertible(
            f"mixed_precision={shown} {branch.why}; pass fully_shard "
            "mp_policy=MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...) with the same dtypes",
            None if branch.source is argument.value else branch.source,
        )

    def _assigned(self, argument, definitions, plan) -> "Assigned | RunTime | None":
        """Each assignment converted where it stands; read at run time by the helper where one cannot be
        (a value the rewrite cannot read, a buffer_dtype the policy it becomes has no field for)."""
        branches, maybe_none, redefined = [], False, {}
        for definition in definitions:
            tree = choice.resolve(definition.value, lambda value, source: self._branch(value, source, argument), lambda node: node)
            for settings in choice.leaves(tree):
                if isinstance(settings, _Unknown) or settings is not None and self._buffer_dtype(settings) is not None:
                    return RunTime(call(self.ctx.add_helper(HELPER), argument.value))
                if settings is None:
                    maybe_none = True
                else:
                    branches.append(settings)
            value = choice.join(tree, lambda settings: cst.Name("None") if settings is None else self._policy(settings, root=True))
            if self.ctx.code(value) != self.ctx.code(definition.value):
                redefined[definition] = value
        plan.redefined.update(redefined)
        return Assigned(argument.value, branches, maybe_none, tuple(redefined)) if branches else None

    def finish(self, plan) -> None:
        """Children's policies derive from a variable only where every value it may hold agrees on how;
        otherwise the helper reads the variable at run time, and its assignments stay as they are."""
        assigned = plan.mixed_precision
        if not (isinstance(assigned, Assigned) and plan.has_children):
            return
        casts = {(s.cast_root or s.cast, s.cast) for s in assigned.settings}
        kept = set()
        for settings in assigned.settings:
            classes = self._full_precision_classes(settings, plan.site.node)
            kept.add(None if classes is None else self.ctx.module.code_for_node(classes))
        if len(casts) > 1 or len(kept) > 1:
            for definition in assigned.redefined:
                del plan.redefined[definition]
            plan.mixed_precision = RunTime(call(self.ctx.add_helper(HELPER), assigned.name))

    def _branch(self, value, source, argument) -> "Settings | _Unknown | None":
        """The settings of one possible value (None: no mixed precision); `source` is it as written."""
        if self.analysis.is_none(value):
            return None
        if isinstance(value, cst.Call) and self.ctx.matches(value.func, MIXED_PRECISION):
            return self._settings(value)
        shown = self.ctx.code(source)
        where = None if source is argument.value else source
        if self.ctx.qualified_names(value) and all(q.startswith("torch.") for q in self.ctx.qualified_names(value)):
            raise Unconvertible(
                f"mixed_precision={shown} is not a MixedPrecision (FSDP1 fails on it); write "
                f"MixedPrecision(param_dtype={shown}), i.e. FSDP2's mp_policy=MixedPrecisionPolicy(param_dtype={shown})",
                where,
            )
        why = "is also used outside FSDP(...) calls" if self.analysis.shared_name(value) else "is known only at run time"
        return _Unknown(source, why)

    def _settings(self, call_node: cst.Call) -> Settings:
        settings = Settings()
        for index, arg in enumerate(call_node.args):
            if arg.star or (arg.keyword is None and index >= len(FIELDS)):
                raise Unconvertible("MixedPrecision(...) arguments cannot be read statically; spell them out as keywords")
            settings.values[arg.keyword.value if arg.keyword else FIELDS[index]] = arg.value
        for flag, default in (("keep_low_precision_grads", False), ("cast_forward_inputs", False), ("cast_root_forward_inputs", True)):
            value = settings.values.get(flag)
            literal = default if value is None else self.analysis.literal_bool(value)
            if literal is None:
                raise Unconvertible(f"MixedPrecision({flag}={self.ctx.code(value)}) must be True or False to be converted")
            if flag == "keep_low_precision_grads" and literal:
                raise Unconvertible(
                    "MixedPrecision(keep_low_precision_grads=True) has no FSDP2 form (FSDP2 keeps gradients in the "
                    "parameters' dtype); drop it to convert, gradients are then upcast as with the default"
                )
            if flag == "cast_forward_inputs":
                settings.cast = literal
            elif flag == "cast_root_forward_inputs":
                settings.cast_root = literal
        return settings

    # ----- building the FSDP2 policies ----------------------------------------------------

    def policy(self, settings, root: bool) -> cst.BaseExpression:
        """The MixedPrecisionPolicy of the root (`root`) or of an auto-wrapped child, in each branch of a choice."""
        if isinstance(settings, Assigned):
            return self._assigned_policy(settings, root)
        if isinstance(settings, RunTime):
            return settings.field("root" if root else "children")
        return choice.join(settings, lambda branch: self._policy(branch, root))

    def _assigned_policy(self, assigned: Assigned, root: bool) -> cst.BaseExpression:
        default = call(self.ctx.require_import(*POLICY))
        first = assigned.settings[0]  # all agree on the casts (finish)
        casts = any(settings.dtype("param_dtype") is not None for settings in assigned.settings)
        if root or not (casts and first.cast_root and not first.cast):
            return expression("NAME or DEFAULT", NAME=assigned.name, DEFAULT=default) if assigned.maybe_none else assigned.name
        replace = self.analysis.names.ref(assigned.name, "dataclasses.replace")
        child = expression(f"{replace}(NAME, cast_forward_inputs=False)", NAME=assigned.name)
        if not assigned.maybe_none:
            return child
        return expression("CHILD if NAME is not None else DEFAULT", CHILD=child, NAME=assigned.name, DEFAULT=default)

    def _policy(self, settings: Settings | None, root: bool) -> cst.Call:
        if settings is None:
            return call(self.ctx.require_import(*POLICY))
        kwargs = {name: settings.dtype(name) for name in ("param_dtype", "reduce_dtype") if settings.dtype(name) is not None}
        if "param_dtype" in kwargs:
            cast = (settings.cast_root or settings.cast) if root else settings.cast
            if not cast:
                kwargs["cast_forward_inputs"] = cst.Name("False")
        return call(self.ctx.require_import(*POLICY), **kwargs)

    def full_precision_policy(self, settings, anchor) -> cst.BaseExpression:
        """For the modules FSDP1 kept in full precision: float32 compute, outputs cast back to param_dtype."""
        if isinstance(settings, Assigned):
            float32 = self.analysis.names.ref(anchor, "torch.float32")
            return expression(f"{self.ctx.require_import(*POLICY)}(param_dtype={float32}, output_dtype=NAME.param_dtype)", NAME=settings.name)
        if isinstance(settings, RunTime):
            return settings.field("full_precision")
        return choice.join(settings, lambda branch: None if branch is None else self._full_precision_policy(branch, anchor))

    def _full_precision_policy(self, settings: Settings, anchor) -> cst.Call:
        param_dtype = settings.dtype("param_dtype")
        if param_dtype is None:
            return call(self.ctx.require_import(*POLICY))
        float32 = self.analysis.names.ref(anchor, "torch.float32")
        return call(self.ctx.require_import(*POLICY), param_dtype=float32, output_dtype=param_dtype)

    def full_precision_classes(self, settings, anchor) -> cst.BaseExpression | None:
        """The classes FSDP1 wrapped separately in full precision (`()` in a branch without); None when there are none."""
        if isinstance(settings, Assigned):  # the same for every value it may hold (finish)
            classes = self._full_precision_classes(settings.settings[0], anchor)
            if classes is None or not settings.maybe_none:
                return classes
            return expression("CLASSES if NAME is not None else ()", CLASSES=classes, NAME=settings.name)
        if isinstance(settings, RunTime):
            return settings.field("full_precision_classes")
        branches = {id(branch): self._full_precision_classes(branch, anchor) for branch in choice.leaves(settings)}
        if all(classes is None for classes in branches.values()):
            return None
        return choice.join(settings, lambda branch: cst.Tuple([]) if branches[id(branch)] is None else branches[id(branch)])

    def _full_precision_classes(self, settings: Settings | None, anchor) -> cst.BaseExpression | None:
        if settings is None:
            return None
        given = settings.values.get("_module_classes_to_ignore")
        if given is None:
            return cst.parse_expression(self.analysis.names.ref(anchor, BATCH_NORM))
        if isinstance(given, (cst.Tuple, cst.List)) and not given.elements:
            return None
        return call("tuple", given)

    def buffer_dtype(self, settings) -> cst.BaseExpression | None:
        """The dtype buffers must be cast to, unless it is a no-op (None, float32).

        For a choice, an if-expression giving None in the branches that cast nothing; known only
        at run time, an expression that may be None (see may_skip_buffer_cast).
        """
        if isinstance(settings, Assigned):  # never with a buffer_dtype (see _assigned)
            return None
        if isinstance(settings, RunTime):  # None at run time where nothing is cast
            return settings.field("buffer_dtype")
        if not isinstance(settings, choice.Choice):
            return self._buffer_dtype(settings)
        dtypes = {id(branch): self._buffer_dtype(branch) if branch is not None else None for branch in choice.leaves(settings)}
        if all(dtype is None for dtype in dtypes.values()):
            return None
        return choice.join(settings, lambda branch: cst.Name("None") if dtypes[id(branch)] is None else dtypes[id(branch)])

    @staticmethod
    def may_skip_buffer_cast(settings) -> bool:
        """Whether buffer_dtype(settings) may be None when the program runs."""
        return isinstance(settings, RunTime)

    def _buffer_dtype(self, settings: Settings) -> cst.BaseExpression | None:
        dtype = settings.dtype("buffer_dtype")
        if dtype is None or self.ctx.matches(dtype, "torch.float32", "torch.float"):
            return None
        return dtype
