"""Parameters kept before their module is wrapped: `opt = AdamW(model.parameters())`, then `model = FSDP(model)`.

FSDP1 with use_orig_params=True kept the module's Parameter objects, so an
optimizer built from them before wrapping still trained the model;
`fully_shard` replaces them with DTensors, and that optimizer would step
tensors the model no longer uses (MF108). The wrapping is often a function
of its own (`def wrap_model(m): return FSDP(m, ...)`), called from another
module, or from a class's `__init__` that another function hands the model
to: the statement keeping the parameters is then in a caller, a few calls
up, anywhere in the program. Callers are found by the function's name in the
bytes of every file, resolved as factory_callers.py resolves them.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst

from migrate_fsdp.rewrite.analysis.factory_callers import calls_function
from migrate_fsdp.rewrite.analysis.models import PARAMETER_READS
from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls
from migrate_fsdp.rewrite.syntax import dotted, walk

_REDUCERS = ("sum", "len", "print", "any", "all", "max", "min", "int", "float", "str", "repr", "format")
_KEEPERS = ("append", "extend", "add_param_group", "update", "insert")
# A function handed the module whose name says it builds an optimizer or parameter groups from it
# (`build_optimizer(net)`, `get_param_groups(model)`, `torch.optim.AdamW(...)`).
_BUILDS_OPTIMIZERS = re.compile(r"optim|group|adam|sgd", re.IGNORECASE)
_DEPTH = 3  # callers handing the module on, followed this far


@dataclass(frozen=True)
class Handed:
    """The parameter of a function that a constructor wraps: callers hand the module in by `index` or `keyword`."""

    function: str
    owner: str | None  # the module-level class of a method, else None
    index: int | None  # its position among the arguments a caller writes (`self` not counted)
    keyword: str


def keeping(call: cst.Call, ancestors) -> tuple[list[cst.Name], cst.CSTNode | None]:
    """The names whose parameters `call` hands out (`net.parameters()`, `build_optimizer(net)`) and the statement
    around it that keeps them (`opt = SGD(...)`, `groups.append(...)`), if one does."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in PARAMETER_READS and isinstance(func.value, cst.Name):
        return [func.value], None if _names_only(call, ancestors) else _keeping_statement(ancestors)
    handed = [arg.value for arg in call.args if isinstance(arg.value, cst.Name) and not arg.star]
    if handed and _BUILDS_OPTIMIZERS.search(dotted(func).rsplit(".", 1)[-1]):
        return handed, _keeping_statement(ancestors)
    return [], None


def _names_only(call: cst.Call, ancestors) -> bool:
    """`[n for n, p in net.named_parameters() if ...]`: the names, which fully_shard keeps, not the parameters."""
    loop = ancestors[-1] if ancestors else None
    comprehension = ancestors[-2] if len(ancestors) >= 2 else None
    if not (isinstance(loop, cst.CompFor) and loop.iter is call and isinstance(comprehension, (cst.ListComp, cst.SetComp))):
        return False
    target = loop.target
    name = target.elements[0].value if isinstance(target, cst.Tuple) and len(target.elements) == 2 else None
    return isinstance(name, cst.Name) and isinstance(comprehension.elt, cst.Name) and comprehension.elt.value == name.value


def _keeping_statement(ancestors) -> cst.CSTNode | None:
    """The statement around a call, when it keeps what the call returns rather than reducing it
    (`sum(p.numel() for p in ...)`) or looping over it."""
    for node in reversed(ancestors):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in _REDUCERS:
            return None
        if isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            return node
        if isinstance(node, cst.Expr):
            call = node.value
            keeps = isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value in _KEEPERS
            return node if keeps else None
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return None
    return None


def kept_message(code: str, where: str = "") -> str:
    """Why a constructor stays: `code`, the statement keeping the parameters (`where` it is, when elsewhere)."""
    code = " ".join(code.split())
    code = code if len(code) <= 60 else code[:57] + "..."
    return (
        f"`{code}`{where} keeps the parameters from before wrapping, which FSDP1 kept with use_orig_params but "
        "fully_shard replaces (an optimizer would train nothing): build it after wrapping, from the wrapped model"
    )


def handed(ctx, module: cst.BaseExpression | None, stack) -> Handed | None:
    """The parameter `module` names, when it is one of the innermost function around a constructor (at `stack`)
    that callers can be found for: a module-level function, or a method of a module-level class."""
    if not isinstance(module, cst.Name):
        return None
    depth = next((i for i in range(len(stack) - 1, -1, -1) if isinstance(stack[i], cst.FunctionDef)), None)
    if depth is None:
        return None
    function, outer = stack[depth], stack[:depth]
    owner = None
    classes = [n for n in outer if isinstance(n, cst.ClassDef)]
    if any(isinstance(n, (cst.FunctionDef, cst.Lambda)) for n in outer) or len(classes) > 1:
        return None
    if classes:
        owner = classes[0].name.value
    return _parameter(ctx, function, module, owner)


def _parameter(ctx, function: cst.FunctionDef, name: cst.Name, owner: str | None) -> Handed | None:
    scope = ctx.scope(name)
    bindings = scope[name.value] if scope is not None else set()
    params = [b.node for b in bindings if isinstance(getattr(b, "node", None), cst.Param)]
    if len(params) != 1:
        return None
    positional = list(function.params.params)
    if params[0] not in positional and params[0] not in function.params.kwonly_params:
        return None
    index = positional.index(params[0]) if params[0] in positional else None
    if owner is not None and index is not None:
        if index == 0:  # the instance itself
            return None
        index -= 1
    return Handed(function.name.value, owner, index, name.value)


def kept_by_callers(
    remote_calls: RemoteCalls, sources: Mapping[str, bytes], path: str, wrapped: Handed, depth: int = 0
) -> tuple[str, str, str] | None:
    """(file, function, code) of a statement keeping the parameters of a module that a caller hands to `wrapped`,
    before the call, following callers that hand on a parameter of their own."""
    called = wrapped.owner if wrapped.function == "__init__" else wrapped.function
    word = re.compile(rb"\b" + re.escape(called.encode()) + rb"\b")
    for caller, data in sources.items():
        if not word.search(data):
            continue
        ctx = remote_calls.context(caller)
        if ctx is None:
            continue
        for node, ancestors in walk(ctx.module):
            if not (isinstance(node, cst.Call) and _calls(ctx, node, ancestors, wrapped, called, caller, path, remote_calls)):
                continue
            given = _argument(node, wrapped)
            if not isinstance(given, cst.Name):
                continue
            scope = next((n for n in reversed(ancestors) if isinstance(n, cst.FunctionDef)), ctx.module)
            kept = _kept_before(ctx, scope, given.value, ctx.position(node))
            holder = scope.name.value if isinstance(scope, cst.FunctionDef) else ""
            if kept is not None:
                return caller, holder, ctx.code(kept)
            outer = handed(ctx, given, ancestors) if depth < _DEPTH else None
            found = outer and kept_by_callers(remote_calls, sources, caller, outer, depth + 1)
            if found:
                return found
    return None


def _calls(ctx, call: cst.Call, ancestors, wrapped: Handed, called: str, caller: str, path: str, remote_calls) -> bool:
    """Whether `call` runs `wrapped`: the function or class by its name, or a method through `self.` in its class."""
    func = call.func
    if wrapped.owner is None or wrapped.function == "__init__":
        return calls_function(ctx, func, called, caller, path, remote_calls)
    classes = [n for n in ancestors if isinstance(n, cst.ClassDef)]
    return (
        caller == path
        and isinstance(func, cst.Attribute)
        and func.attr.value == wrapped.function
        and isinstance(func.value, cst.Name)
        and func.value.value == "self"
        and bool(classes)
        and classes[0].name.value == wrapped.owner
    )


def _argument(call: cst.Call, wrapped: Handed) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == wrapped.keyword:
            return arg.value
    index = wrapped.index
    if index is None or index >= len(call.args) or any(a.star or a.keyword for a in call.args[: index + 1]):
        return None
    return call.args[index].value


def _kept_before(ctx, scope, name: str, at: tuple[int, int]) -> cst.CSTNode | None:
    """The first statement of `scope` (not of functions inside it) before `at` keeping `name`'s parameters."""
    for node, ancestors in walk(scope):
        if not isinstance(node, cst.Call) or ctx.position(node) >= at:
            continue
        inner = next((n for n in reversed(ancestors) if isinstance(n, (cst.FunctionDef, cst.Lambda))), scope)
        if inner is not scope:
            continue
        names, statement = keeping(node, ancestors)
        if statement is not None and any(n.value == name for n in names):
            return statement
    return None
