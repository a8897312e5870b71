"""What converting one FSDP(...) call takes: the keyword rules fill a Plan, the wrap-call rule emits it.

One FSDP1 call becomes several FSDP2 statements whose parts depend on more
than one keyword (the mesh on `sharding_strategy`, `process_group`,
`device_mesh` and `device_id`; the auto-wrapped children's arguments on
`mixed_precision` and `auto_wrap_policy`), so each keyword rule records what
its keyword means here, and the statements are built once all are known.
"""

from dataclasses import dataclass, field
from typing import ClassVar

import libcst as cst

from migrate_fsdp.rewrite.rule import Rule
from migrate_fsdp.rewrite.rules.construction.arguments import Argument, Definition


class Unconvertible(Exception):
    """This keyword's value has no exact FSDP2 form here; the message says what to do instead."""

    def __init__(self, message: str, node: cst.CSTNode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.node = node


@dataclass
class ParamInit:
    """A param_init_fn that only materialises meta tensors: `m.to_empty(device=DEVICE, recurse=False)` (MF110)."""

    device: cst.BaseExpression


@dataclass
class Initialiser:
    """A param_init_fn that initialises weights (`reset_parameters()`), as the user passed it (MF110): it runs on
    the unsharded modules of each unit before its fully_shard call, the units in FSDP1's wrapping order."""

    function: cst.BaseExpression  # the value passed (followed through a name only the call reads)


@dataclass(frozen=True)
class Problem:
    node: cst.CSTNode
    code: str
    message: str


@dataclass(eq=False)
class CallSite:
    """An FSDP1 constructor call (or `functools.partial(FSDP, ...)`) and where it stands."""

    node: cst.Call
    statement: cst.CSTNode  # innermost statement holding it
    role: str  # "assign", "return", "expr" (the whole statement) or "nested"
    can_insert: bool  # statements may go right before/after `statement`
    in_lambda: bool  # inserted statements would run at another time than the call
    is_partial: bool = False
    in_dual_version: bool = False  # inside code that serves FSDP1 and FSDP2 (analysis/versions.py)
    stack: tuple = ()  # original nodes from the module down to the call

    @property
    def target(self) -> cst.BaseExpression | None:
        """What an `x = FSDP(...)` assigns to."""
        if self.role != "assign":
            return None
        small = self.statement.body[0]
        return small.targets[0].target if isinstance(small, cst.Assign) else small.target

    @property
    def placed_in_parent(self) -> bool:
        """`model.blocks[i] = FSDP(block)`, `model.layer = FSDP(model.layer)`: wrapped by hand as a part of a model
        that is wrapped later, which FSDP1 made a non-root unit at its first forward (it casts no inputs then)."""
        target = self.target
        if isinstance(target, cst.Subscript):
            return True
        module = self.node.args[0].value if self.node.args and self.node.args[0].keyword is None else None
        code = cst.Module([]).code_for_node
        return isinstance(target, cst.Attribute) and module is not None and code(target) == code(module)


@dataclass
class Strategy:
    """FSDP1's sharding_strategy: a member name known statically, or an expression giving a member or its name."""

    name: str | None = "FULL_SHARD"
    runtime: cst.BaseExpression | None = None
    possible: frozenset[str] | None = None  # the members a run-time choice picks from, when all are written out

    def may_be(self, names) -> bool:
        """Whether the strategy is, or at run time may be, one of the members `names`."""
        chosen = {self.name} if self.runtime is None else self.possible
        return chosen is None or bool(chosen & set(names))


@dataclass
class Plan:
    site: CallSite
    arguments: dict[str, Argument]
    module: cst.BaseExpression | None = None
    problems: list[Problem] = field(default_factory=list)
    definitions: list[Definition] = field(default_factory=list)  # names followed to values this conversion inlines
    # fully_shard keyword arguments given to every call: name -> (value, FSDP1 argument it replaces)
    kwargs: dict[str, tuple[cst.BaseExpression, cst.Arg | None]] = field(default_factory=dict)
    strategy: Strategy = field(default_factory=Strategy)
    process_group: cst.BaseExpression | None = None
    device_mesh: cst.BaseExpression | None = None
    device: cst.BaseExpression | None = None  # FSDP1's device_id
    mesh: cst.BaseExpression | None = None  # the mesh every fully_shard call gets, when not FSDP2's default
    sharding: cst.BaseExpression | None = None  # runtime `**` mapping of a strategy known only at run time
    policy: object | None = None  # auto_wrap_policy.Policy
    ignored: object | None = None  # ignored_modules.Ignored
    mixed_precision: object | None = None  # mixed_precision.Settings
    forward_prefetch: bool | cst.BaseExpression = False  # an expression: a flag read at run time
    sync_module_states: bool | cst.BaseExpression = False  # an expression: a flag read at run time
    param_init: ParamInit | Initialiser | None = None
    parameter_tags: bool = False  # use_orig_params=True in a program setting attributes on parameters (MF108)
    keeps_parameters: bool = False  # use_orig_params may be True: FSDP1 kept the module's Parameter objects (MF108)
    before: list[cst.BaseStatement] = field(default_factory=list)  # statements that must run first
    # assignments of variables only this call reads, rewritten where they stand: Definition -> its new value
    redefined: dict[Definition, cst.BaseExpression] = field(default_factory=dict)

    def value(self, name: str) -> cst.BaseExpression | None:
        argument = self.arguments.get(name)
        return None if argument is None else argument.value

    @property
    def has_children(self) -> bool:
        return self.policy is not None

    @property
    def syncs_each_unit(self) -> bool:
        """sync_module_states with an initialising param_init_fn: each unit is initialised and broadcast from rank 0
        right before its fully_shard call, as FSDP1 did (MF110), rather than loaded from rank 0's state dict."""
        return self.sync_module_states is not False and isinstance(self.param_init, Initialiser)


class KeywordRule(Rule):
    """A rule for some FSDP1 constructor keywords, applied by the wrap-call rule (MF101).

    `apply` records what the keyword means in `plan` or raises Unconvertible;
    `leftovers` maps FSDP1 names of this keyword's world (e.g. MixedPrecision)
    to the message given when one is found outside a converted call.
    """

    keywords: ClassVar[tuple[str, ...]] = ()
    leftovers: ClassVar[dict[str, str]] = {}

    def __init__(self, ctx, analysis=None) -> None:
        super().__init__(ctx)
        self.analysis = analysis  # the wrap-call rule's shared readers (definitions, names)

    def apply(self, argument: Argument, plan: Plan) -> None:
        raise NotImplementedError

    def finish(self, plan: Plan) -> None:
        """Called once every keyword was applied, for what depends on several of them."""
