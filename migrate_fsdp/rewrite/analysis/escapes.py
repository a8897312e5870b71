"""Whether the model an FSDP(...) call builds can reach code this file does not show.

The program model ties a use to a constructor only within one file. A model
handed to a function of another module (`train_one_epoch(model, ...)`), returned,
or stored on an object may meet code there whose FSDP1 uses stay FSDP1 because
another constructor of the program stays: converting this constructor would hand
that code an FSDP2 model (`isinstance(model, FSDP)` turns false, `model.no_sync`
raises). Such a constructor converts only when no such use stays. Calls into torch
and a few inspecting builtins cannot hold the program's FSDP1 code.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import assignments_of
from migrate_fsdp.rewrite.syntax import walk

_INSPECTING_BUILTINS = tuple(
    f"builtins.{name}" for name in ("isinstance", "print", "len", "type", "id", "hasattr", "getattr", "repr", "str")
)


def escapes(ctx, call: cst.Call, stack) -> bool:
    """Whether the value of `call` (at `stack`, from the module down) may be seen by code out of this file's sight."""
    parents = [n for n in stack if n is not call]
    if not parents:
        return True
    statement = parents[-1]
    if isinstance(statement, cst.Expr):
        return False  # `FSDP(m)` as a statement: only the module object `m` lives on, seen where `m` is
    if not (isinstance(statement, cst.Assign) and statement.value is call and len(statement.targets) == 1):
        return True  # returned, passed on, stored in a container, bound twice
    target = statement.targets[0].target
    if not isinstance(target, cst.Name):
        return True  # `self.model = FSDP(...)`: every method, and whoever holds the object, sees it
    function = next((n for n in reversed(parents) if isinstance(n, cst.FunctionDef)), None)
    if function is None:
        return True  # a module-level model can be imported by any file
    assignment = next((a for a in assignments_of(ctx.scope(target), target.value) if a.node is target), None)
    if assignment is None:
        return True
    references = {id(access.node) for access in assignment.references}
    return any(_hands_on(ctx, node, ancestors) for node, ancestors in walk(function.body) if id(node) in references)


def _hands_on(ctx, name: cst.Name, ancestors) -> bool:
    """Whether this read of the model gives it to other code (not `model(x)`, `model.parameters()`)."""
    parent = ancestors[-1] if ancestors else None
    if isinstance(parent, cst.Attribute) and parent.value is name:
        return False
    if isinstance(parent, cst.Call) and parent.func is name:
        return False
    if isinstance(parent, cst.Arg) and len(ancestors) >= 2 and isinstance(ancestors[-2], cst.Call):
        return not _cannot_hold_user_code(ctx, ancestors[-2].func)
    return not isinstance(parent, (cst.Comparison, cst.ComparisonTarget, cst.If, cst.BooleanOperation, cst.UnaryOperation))


def _cannot_hold_user_code(ctx, func) -> bool:
    if ctx.matches(func, *_INSPECTING_BUILTINS):
        return True
    names = ctx.qualified_names(func)
    return bool(names) and all(name == "torch" or name.startswith("torch.") for name in names)
