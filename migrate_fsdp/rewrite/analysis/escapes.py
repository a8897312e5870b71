"""Where the model an FSDP(...) call builds goes beyond the function building it.

Models analysis ties a use to a constructor within one function's data flow. A
model handed to another function (`train_one_epoch(model, ...)`) is followed
into it: a function of this file here, one of another module of the program by
remote_calls.py once every file is read; that function's FSDP1 code on the
parameter then converts with the constructor, or stays with it. A model that is
returned, stored on an object or at module level, or handed to code the program
cannot find escapes: it may meet code whose FSDP1 uses stay FSDP1 because
another constructor stays, where an FSDP2 model would break (`isinstance(model,
FSDP)` turns false, `model.no_sync` raises), so such a constructor converts only
when no such use stays. Calls into torch and a few inspecting builtins cannot
hold the program's FSDP1 code.
"""

from dataclasses import dataclass

import libcst as cst

from migrate_fsdp.rewrite.analysis.guards import in_non_fsdp_branch, unwraps_if_wrapped
from migrate_fsdp.rewrite.analysis.models import PARAMETER_READS, assignments_of
from migrate_fsdp.rewrite.helpers import helper_names, is_inserted_helper
from migrate_fsdp.rewrite.syntax import walk

_INSPECTING_BUILTINS = tuple(
    f"builtins.{name}" for name in ("isinstance", "print", "len", "type", "id", "hasattr", "getattr", "repr", "str")
)


# What an FSDP1 model has and an FSDP2 one has not, or answers otherwise (a full state dict, the wrapped module,
# the wrapper's own state and internals): read on the model where no rule took it for an FSDP1 model's, it keeps
# the model FSDP1 (analysis/program.py); rules convert or report them in sight (state_dict_type.py,
# wrapper_attributes.py, flat_param_internals.py).
FSDP1_SURFACE = frozenset(
    {
        "state_dict", "load_state_dict", "module", "check_is_root", "process_group", "sharding_strategy", "params",
        "training_state", "compute_device", "mixed_precision", "cpu_offload", "backward_prefetch", "forward_prefetch",
        "limit_all_gathers", "rank", "world_size", "register_comm_hook", "apply", "_fsdp_wrapped_module",
        "_flat_param", "_handle", "_is_root", "_sharding_strategy", "_use_orig_params",
    }
)


class Escape(Exception):
    """The model may reach code out of this file's sight."""


@dataclass(frozen=True)
class Remote:
    """A call handing the model to a function another module defines, by position or keyword."""

    function: str  # qualified name, as the caller imports it (`pkg.loop.train`)
    index: int | None
    keyword: str | None
    result_in_sight: bool = True  # what the call returns stays in sight (`unwrap(model).config`), if it is the model
    parameters: bool = False  # only the model's parameters are handed (`cast(model.parameters())`): the function
    # sees them, and a function out of sight (a library's optimizer) sees no model


@dataclass(frozen=True)
class Reach:
    """Where a model goes beyond the function building it: functions of this file, functions of other modules."""

    callees: frozenset = frozenset()
    remotes: frozenset = frozenset()
    returns: bool = False  # the function may hand the model back (`return model`, `return m.module if ... else m`);
    # for a constructor's model: a module-level function returns it, its callers follow it (factory_callers.py)
    importable: bool = False  # a module-level model: a file importing its module reaches it too
    escaped: bool = False  # the model also goes out of sight (what is in sight before that is listed)
    fsdp1_reads: frozenset = frozenset()  # (position, attribute) of each FSDP1 surface read of the model (FSDP1_SURFACE)

    def __bool__(self) -> bool:
        return bool(self.callees or self.remotes)


def escapes(ctx, call: cst.Call, stack) -> Reach | None:
    """Where the value of `call` (at `stack`, from the module down) goes beyond the function building it.

    None: it may be seen by code out of the program's sight. Otherwise the
    functions it is handed to (they see it as a parameter, and their FSDP1
    code must convert with the constructor): of this file by name, of other
    modules as `Remote` calls that the program resolves (remote_calls.py).
    """
    parents = [n for n in stack if n is not call]
    if not parents:
        return None
    statement = parents[-1]
    if isinstance(statement, cst.Expr):
        return Reach()  # `FSDP(m)` as a statement: only the module object `m` lives on, seen where `m` is
    if isinstance(statement, cst.Return) and statement.value is call:
        return Reach(returns=True) if factory(parents) is not None else None
    if not (isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1):
        return None  # returned, passed on, stored in a container, bound twice
    target = statement.targets[0].target
    if not isinstance(target, cst.Name):
        return None  # `self.model = FSDP(...)`: every method, and whoever holds the object, sees it
    function = next((n for n in reversed(parents) if isinstance(n, cst.FunctionDef)), None)
    callees: set[str] = set()
    remotes: set[Remote] = set()
    fsdp1_reads: list = []
    makes_models = ctx.matches(call.func, "functools.partial")  # a factory: each call of it builds a model
    returned = [] if factory(parents) is not None and not makes_models else None  # its callers follow it on
    escaped = False
    try:
        _follow(
            ctx, ctx.module if function is None else function, target, callees, seen={}, remotes=remotes, makes_models=makes_models,
            returned=returned, fsdp1_reads=fsdp1_reads,
        )
    except Escape:
        escaped = True  # what was found in sight before still counts: an FSDP1 read there holds the model
    return Reach(
        frozenset(callees),
        frozenset(remotes),
        returns=bool(returned),
        importable=function is None,  # a module-level model: also seen by any file importing its module (decide)
        escaped=escaped,
        fsdp1_reads=_positions(ctx, fsdp1_reads),
    )


def factory(parents) -> str | None:
    """The name of the module-level, undecorated function holding what `parents` lead to (its callers can be found
    by name), if that is where it is."""
    functions = [n for n in parents if isinstance(n, (cst.FunctionDef, cst.ClassDef, cst.Lambda))]
    if len(functions) != 1 or not isinstance(functions[0], cst.FunctionDef) or functions[0].decorators:
        return None
    return functions[0].name.value


def _positions(ctx, nodes) -> frozenset:
    return frozenset((ctx.position(node), node.attr.value) for node in nodes)


def parameter_reach(ctx, function: cst.FunctionDef, index: int | None, keyword: str | None) -> Reach | None:
    """Where a model handed to `function` (by position `index` or `keyword`) goes in this file; None: out of sight."""
    parameter = bound_parameter(function, index, keyword)
    if parameter is None:
        return None
    callees: set[str] = {function.name.value}
    returned: list = []
    fsdp1_reads: list = []
    try:
        _follow(ctx, function, parameter, callees, seen={}, remotes=None, returned=returned, fsdp1_reads=fsdp1_reads)
    except Escape:
        return None
    return Reach(frozenset(callees), returns=bool(returned), fsdp1_reads=_positions(ctx, fsdp1_reads))


def _follow(
    ctx,
    function: cst.FunctionDef,
    name: cst.Name,
    callees: set[str],
    seen: dict[int, list | None],
    remotes,
    makes_models=False,
    returned=None,
    fsdp1_reads=None,
) -> None:
    """Every read of `name` (bound in `function`) in that function keeps the model in sight, or raises Escape.
    `makes_models`: `name` is a `functools.partial(FSDP, ...)` factory, and so are the models its calls make.
    `returned`: `name` is a parameter, which the function may hand back to its caller (noted there); None: a
    model returned escapes. `fsdp1_reads`: the model's attributes of FSDP1_SURFACE read are noted there."""
    assignment = next(
        (a for a in assignments_of(ctx.scope(name), name.value) if a.node is name or getattr(a.node, "name", None) is name),
        None,
    )
    if assignment is None:
        raise Escape
    references = {id(access.node) for access in assignment.references}
    reads = [(node, ancestors) for node, ancestors in walk(*_bodies(function)) if id(node) in references or node is name]
    bound = next((i for i, (node, _) in enumerate(reads) if node is name), 0)  # a parameter: bound before all
    loops = {id(n) for n in (reads[bound][1] if reads and reads[bound][0] is name else ()) if isinstance(n, (cst.For, cst.While))}
    for index, (node, ancestors) in enumerate(reads):
        if node is name:
            continue
        if index < bound and not any(id(n) in loops for n in ancestors):
            continue  # read before the binding, and not again after it in a loop: an earlier value (scopes ignore order)
        _read(ctx, node, ancestors, callees, seen, remotes, function if makes_models else None, returned, fsdp1_reads)


def _read(
    ctx, name: cst.CSTNode, ancestors, callees: set[str], seen: dict, remotes, factory_in=None, returned=None, fsdp1_reads=None
) -> None:
    """This read of the model keeps it in sight (`model(x)`, `model.parameters()`, a function of this file), or
    raises Escape. `remotes`: where calls into other modules are collected; None: such a call is out of sight.
    `factory_in`: the function where `name` is a factory; the model each of its calls makes is followed there."""
    parent = ancestors[-1] if ancestors else None
    if isinstance(parent, cst.Attribute) and parent.value is name:
        if parent.attr.value in PARAMETER_READS and remotes is not None and factory_in is None:
            _parameters_handed(ctx, parent, ancestors, remotes)
        if fsdp1_reads is not None and parent.attr.value in FSDP1_SURFACE:
            unwrap = parent.attr.value == "module" and unwraps_if_wrapped(ctx, (*ancestors, parent), name.value)
            if not in_non_fsdp_branch((*ancestors, name)) and not unwrap:  # where the program says it runs
                fsdp1_reads.append(parent)  # without FSDP: its own
        return
    if isinstance(parent, cst.Call) and parent.func is name:
        if factory_in is not None:
            _made(ctx, factory_in, parent, ancestors[:-1], callees, seen, remotes)
        return
    if isinstance(parent, cst.Arg) and len(ancestors) >= 2 and isinstance(ancestors[-2], cst.Call):
        call = ancestors[-2]
        if _cannot_hold_user_code(ctx, call.func):
            return
        binding = argument_binding(call, parent)
        if binding is None:
            raise Escape
        callee = local_function(ctx, call.func)
        result = (call, ancestors[:-2])  # where the call's value goes: the model itself, if the callee hands it back
        if callee is None and remotes is not None and factory_in is None:
            in_sight = _in_sight(ctx, *result, callees, seen, remotes, returned, fsdp1_reads)
            remotes.add(Remote(_remote_name(ctx, call), *binding, in_sight))
            return
        parameter = bound_parameter(callee, *binding) if callee is not None else None
        if parameter is None:
            raise Escape
        callees.add(callee.name.value)
        if id(parameter) not in seen:
            seen[id(parameter)] = None  # being followed (a recursive call): as if it may hand the model back
            handed_back: list = []
            makes_models = factory_in is not None
            _follow(ctx, callee, parameter, callees, seen, remotes, makes_models, handed_back, fsdp1_reads)
            seen[id(parameter)] = handed_back
        handed_back = seen[id(parameter)]
        if (handed_back is None or handed_back) and factory_in is None:
            _read(ctx, *result, callees, seen, remotes, None, returned, fsdp1_reads)
        return
    if isinstance(parent, cst.Return) and returned is not None:
        returned.append(parent)  # handed back: the caller follows what it does with the call's value
        return
    if isinstance(parent, cst.IfExp) and parent.test is not name:  # `m.module if isinstance(m, FSDP) else m`
        _read(ctx, parent, ancestors[:-1], callees, seen, remotes, factory_in, returned, fsdp1_reads)
        return
    # A test, or text for a log (`f"model:\n{model}"`, a repr, as `print` and `repr` take it).
    tested = (cst.Comparison, cst.ComparisonTarget, cst.If, cst.BooleanOperation, cst.UnaryOperation, cst.Expr)
    if not isinstance(parent, (*tested, cst.FormattedStringExpression)):
        raise Escape


def _parameters_handed(ctx, read: cst.Attribute, ancestors, remotes) -> None:
    """`f(model.parameters())` of a function another module defines: the model's parameters reach it."""
    if len(ancestors) < 4:
        return
    made, arg, call = ancestors[-2], ancestors[-3], ancestors[-4]
    if not (isinstance(made, cst.Call) and made.func is read and isinstance(arg, cst.Arg) and isinstance(call, cst.Call)):
        return
    binding = argument_binding(call, arg)
    if binding is None or _cannot_hold_user_code(ctx, call.func) or local_function(ctx, call.func) is not None:
        return
    try:
        remotes.add(Remote(_remote_name(ctx, call), *binding, parameters=True))
    except Escape:
        return  # a builtin, torch, or a name of this module's own


def _in_sight(ctx, call, ancestors, callees: set[str], seen: dict, remotes, returned, fsdp1_reads) -> bool:
    """What `call` returns, were it the model, would stay in sight."""
    try:
        _read(ctx, call, ancestors, callees, seen, remotes, None, returned, fsdp1_reads)
    except Escape:
        return False
    return True


def _made(ctx, function: cst.FunctionDef, call: cst.Call, ancestors, callees: set[str], seen: dict, remotes) -> None:
    """`model = wrapper(net)` of a factory: the model is followed as one FSDP(...) built; used otherwise, it escapes."""
    holder = ancestors[-1] if ancestors else None
    if isinstance(holder, cst.Expr):
        return
    if not (isinstance(holder, cst.Assign) and holder.value is call and len(holder.targets) == 1):
        raise Escape
    target = holder.targets[0].target
    if not isinstance(target, cst.Name):
        raise Escape
    if id(target) not in seen:
        seen[id(target)] = []
        _follow(ctx, function, target, callees, seen, remotes)


def argument_binding(call: cst.Call, arg: cst.Arg) -> tuple[int | None, str | None] | None:
    """(position, keyword) by which `arg` of `call` binds a parameter; None when a `*`/`**` hides it."""
    if arg.star:
        return None
    if arg.keyword is not None:
        return None, arg.keyword.value
    index = call.args.index(arg)
    if any(a.star or a.keyword is not None for a in call.args[:index]):
        return None
    return index, None


def _remote_name(ctx, call: cst.Call) -> str:
    """The qualified name of a function another module defines that `call` calls; Escape when it is not one."""
    names = ctx.qualified_names(call.func)
    if len(names) != 1:
        raise Escape
    (name,) = names
    if "." not in name.lstrip(".") or name.startswith(("builtins.", "torch.")):
        raise Escape  # a name of this module's own (a class, a variable) or a builtin
    return name


def local_function(ctx, func) -> cst.FunctionDef | None:
    """The module-level or nested `def` a called name refers to, when it is the only binding in sight."""
    if not isinstance(func, cst.Name):
        return None
    assignments = assignments_of(ctx.scope(func), func.value)
    if len(assignments) != 1 or not isinstance(assignments[0].node, cst.FunctionDef):
        return None
    function = assignments[0].node
    return function if transparent(ctx, function) else None


# Decorators that call the function as it is, with the same arguments: the model reaches its body.
_TRANSPARENT = ("torch.no_grad", "torch.inference_mode", "torch.enable_grad", "torch.autograd.grad_mode.no_grad")


def transparent(ctx, function: cst.FunctionDef) -> bool:
    """Whether a call of `function` runs its body with the arguments given (`@torch.no_grad()`, no decorator)."""
    for decorator in function.decorators:
        node = decorator.decorator
        node = node.func if isinstance(node, cst.Call) and not node.args else node
        if not ctx.matches(node, *_TRANSPARENT):
            return False
    return True


def bound_parameter(function: cst.FunctionDef, index: int | None, keyword: str | None) -> cst.Name | None:
    """The parameter of `function` bound by position `index` or by `keyword`, when plain Python binding says so."""
    params = function.params
    positional = (*params.posonly_params, *params.params)
    if keyword is not None:
        return next((p.name for p in (*positional, *params.kwonly_params) if p.name.value == keyword), None)
    return positional[index].name if index is not None and index < len(positional) else None


def _cannot_hold_user_code(ctx, func) -> bool:
    if ctx.matches(func, *_INSPECTING_BUILTINS):
        return True
    if isinstance(func, cst.Name) and func.value in helper_names():  # one a previous rewrite inserted
        bindings = assignments_of(ctx.scope(func), func.value)
        if len(bindings) == 1 and any(statement is bindings[0].node for statement in ctx.module.body):
            return is_inserted_helper(bindings[0].node, ctx.module)
    names = ctx.qualified_names(func)
    return bool(names) and all(name == "torch" or name.startswith("torch.") for name in names)


def _bodies(function) -> tuple:
    """The statements to search: a function's body, or a module's statements."""
    return tuple(function.body) if isinstance(function, cst.Module) else (function.body,)
