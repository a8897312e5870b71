"""Whether the model an FSDP(...) call builds can reach code this file does not show.

The program model ties a use to a constructor only within one file. A model
handed to a function of another module (`train_one_epoch(model, ...)`), returned,
or stored on an object may meet code there whose FSDP1 uses stay FSDP1 because
another constructor of the program stays: converting this constructor would hand
that code an FSDP2 model (`isinstance(model, FSDP)` turns false, `model.no_sync`
raises). Such a constructor converts only when no such use stays. Calls into torch
and a few inspecting builtins cannot hold the program's FSDP1 code; a function of
the same file is followed into, and its FSDP1 code on the model goes with the
constructor.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import assignments_of
from migrate_fsdp.rewrite.syntax import walk

_INSPECTING_BUILTINS = tuple(
    f"builtins.{name}" for name in ("isinstance", "print", "len", "type", "id", "hasattr", "getattr", "repr", "str")
)


class Escape(Exception):
    """The model may reach code out of this file's sight."""


def escapes(ctx, call: cst.Call, stack) -> frozenset[str] | None:
    """Where the value of `call` (at `stack`, from the module down) goes beyond the function building it.

    None: it may be seen by code out of this file's sight. Otherwise the
    names of the functions of this file it is handed to (they see it as a
    parameter, and their FSDP1 code must convert with the constructor).
    """
    parents = [n for n in stack if n is not call]
    if not parents:
        return None
    statement = parents[-1]
    if isinstance(statement, cst.Expr):
        return frozenset()  # `FSDP(m)` as a statement: only the module object `m` lives on, seen where `m` is
    if not (isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1):
        return None  # returned, passed on, stored in a container, bound twice
    target = statement.targets[0].target
    if not isinstance(target, cst.Name):
        return None  # `self.model = FSDP(...)`: every method, and whoever holds the object, sees it
    function = next((n for n in reversed(parents) if isinstance(n, cst.FunctionDef)), None)
    if function is None:
        return None  # a module-level model can be imported by any file
    callees: set[str] = set()
    try:
        _follow(ctx, function, target, callees, seen=set())
    except Escape:
        return None
    return frozenset(callees)


def _follow(ctx, function: cst.FunctionDef, name: cst.Name, callees: set[str], seen: set[int]) -> None:
    """Every read of `name` (bound in `function`) in that function keeps the model in sight, or raises Escape."""
    assignment = next(
        (a for a in assignments_of(ctx.scope(name), name.value) if a.node is name or getattr(a.node, "name", None) is name),
        None,
    )
    if assignment is None:
        raise Escape
    references = {id(access.node) for access in assignment.references}
    for node, ancestors in walk(function.body):
        if id(node) in references:
            _read(ctx, node, ancestors, callees, seen)


def _read(ctx, name: cst.Name, ancestors, callees: set[str], seen: set[int]) -> None:
    """This read of the model keeps it in sight (`model(x)`, `model.parameters()`, a function of this file), or raises Escape."""
    parent = ancestors[-1] if ancestors else None
    if isinstance(parent, cst.Attribute) and parent.value is name:
        return
    if isinstance(parent, cst.Call) and parent.func is name:
        return
    if isinstance(parent, cst.Arg) and len(ancestors) >= 2 and isinstance(ancestors[-2], cst.Call):
        call = ancestors[-2]
        if _cannot_hold_user_code(ctx, call.func):
            return
        callee = _local_function(ctx, call.func)
        parameter = _parameter(callee, call, parent) if callee is not None else None
        if parameter is None:
            raise Escape
        callees.add(callee.name.value)
        if id(parameter) not in seen:
            seen.add(id(parameter))
            _follow(ctx, callee, parameter, callees, seen)
        return
    if not isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.If, cst.BooleanOperation, cst.UnaryOperation)):
        raise Escape


def _local_function(ctx, func) -> cst.FunctionDef | None:
    """The module-level or nested `def` a called name refers to, when it is the only binding in sight."""
    if not isinstance(func, cst.Name):
        return None
    assignments = assignments_of(ctx.scope(func), func.value)
    if len(assignments) != 1 or not isinstance(assignments[0].node, cst.FunctionDef):
        return None
    function = assignments[0].node
    return None if function.decorators else function


def _parameter(function: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> cst.Name | None:
    """The parameter of `function` that `arg` of `call` binds, when plain Python binding says so."""
    params = function.params
    if arg.star:
        return None
    if arg.keyword is not None:
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.name.value == arg.keyword.value:
                return param.name
        return None
    if any(a.star for a in call.args[: call.args.index(arg)]):
        return None
    index = call.args.index(arg)
    positional = (*params.posonly_params, *params.params)
    return positional[index].name if index < len(positional) else None


def _cannot_hold_user_code(ctx, func) -> bool:
    if ctx.matches(func, *_INSPECTING_BUILTINS):
        return True
    names = ctx.qualified_names(func)
    return bool(names) and all(name == "torch" or name.startswith("torch.") for name in names)
