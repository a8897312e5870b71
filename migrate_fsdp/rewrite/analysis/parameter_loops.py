"""Which model's parameters a loop walks: `for p in model.parameters()`, `for n, p in model.named_parameters()`, a
comprehension over them, also through a dict of them (nanoGPT's `param_dict = {n: p for n, p in
self.named_parameters()}`, then `param_dict.items()`). The rules asking what code does with an FSDP model's
parameters after wrapping read it here: FSDP1 showed them as this rank's flat shards, FSDP2 as DTensors."""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import PARAMETER_READS
from migrate_fsdp.rewrite.syntax import walk

LOOPS = (cst.CompFor, cst.For)
_DICT_VIEWS = ("items", "values")


def model_iterated(ctx, name: str) -> cst.BaseExpression | None:
    """The model whose parameters the innermost loop (at the node visited) binding `name` walks."""
    for node in reversed(ctx.stack):
        if isinstance(node, LOOPS) and binds(node.target, name):
            return parameters_of(ctx, node.iter)
    return None


def parameters_of(ctx, iterated, through_dict: bool = True) -> cst.BaseExpression | None:
    """`model` for `model.parameters()` / `model.named_parameters()` (or a dict of them, with `through_dict`)."""
    call = iterated
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)):
        return None
    if call.func.attr.value in PARAMETER_READS:
        return call.func.value
    if call.func.attr.value in _DICT_VIEWS and through_dict and isinstance(call.func.value, cst.Name):
        return _table_of_parameters(ctx, call.func.value)
    return None


_PASSED_ON = ("builtins.list", "builtins.tuple", "builtins.sorted", "builtins.iter", "builtins.reversed")


def parameters_source(ctx, iterated) -> cst.BaseExpression | None:
    """`parameters_of`, also through what only passes the parameters on: `filter(f, model.parameters())`,
    `list(model.parameters())`, a name assigned them once (`params = list(model.parameters())`), and `m.parameters()`
    of each `m` in `model.modules()`."""
    found = parameters_of(ctx, iterated)
    if found is not None:
        return found
    if isinstance(iterated, cst.Call) and iterated.args and not any(a.star or a.keyword for a in iterated.args):
        if ctx.matches(iterated.func, "builtins.filter") and len(iterated.args) == 2:
            return parameters_source(ctx, iterated.args[1].value)
        if ctx.matches(iterated.func, *_PASSED_ON):
            return parameters_source(ctx, iterated.args[0].value)
        func = iterated.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("parameters", "named_parameters") and isinstance(func.value, cst.Name):
            return _modules_of(ctx, func.value.value)
    if isinstance(iterated, cst.Call) and not iterated.args and isinstance(iterated.func, cst.Attribute):
        held = iterated.func.value  # `self.shadow.values()` of `self.shadow = {n: p.clone() for n, p in ...}`
        if iterated.func.attr.value in _DICT_VIEWS and copies_parameters(ctx, held):
            return held
    if isinstance(iterated, cst.Name):
        value = _assigned_once(ctx, iterated)
        return parameters_source(ctx, value) if value is not None else None
    return None


def optimizer_groups(ctx, iterated) -> cst.Attribute | None:
    """`opt.param_groups` for `group["params"]` of `for group in opt.param_groups` (or `opt.param_groups[0]["params"]`,
    or the second of `zip(group["param_names"], group["params"])`): the parameters an optimizer holds, of whichever
    models were handed to it."""
    if isinstance(iterated, cst.Call) and ctx.matches(iterated.func, "builtins.zip") and len(iterated.args) == 2:
        iterated = iterated.args[1].value
    if not (isinstance(iterated, cst.Subscript) and _key(iterated) == "params"):
        return None
    group = iterated.value
    if isinstance(group, cst.Subscript):
        group = group.value
    elif isinstance(group, cst.Name):
        loop = next((n for n in reversed(ctx.stack) if isinstance(n, LOOPS) and binds(n.target, group.value)), None)
        group = loop.iter if loop is not None else None
    return group if isinstance(group, cst.Attribute) and group.attr.value == "param_groups" else None


def _key(subscript: cst.Subscript) -> str | None:
    """`"params"` of `group["params"]`."""
    index = subscript.slice[0].slice if len(subscript.slice) == 1 else None
    value = index.value if isinstance(index, cst.Index) else None
    return value.evaluated_value if isinstance(value, cst.SimpleString) else None


def copies_parameters(ctx, held) -> bool:
    """`held` is `self.x`, which its class only ever sets to a dict of the values of some model's parameters
    (an EMA's shadow: `{n: p.detach().clone() for n, p in model.named_parameters()}`)."""
    if not (isinstance(held, cst.Attribute) and isinstance(held.value, cst.Name) and held.value.value == "self"):
        return False
    owner = next((n for n in reversed(ctx.stack) if isinstance(n, cst.ClassDef)), None)
    values = _values_assigned(ctx, owner.body, ctx.code(held)) if owner is not None else []
    return bool(values) and all(
        isinstance(value, cst.DictComp) and parameters_of(ctx, value.for_in.iter, through_dict=False) is not None
        for value in values
    )


def _values_assigned(ctx, root, target: str) -> list:
    """The values of every `target = value` under `root` (`target` as written: `param_dict`, `self.shadow`)."""
    return [
        node.value
        for node, _ in walk(root)
        if isinstance(node, cst.Assign) and any(ctx.code(t.target) == target for t in node.targets)
    ]


def _modules_of(ctx, name: str) -> cst.BaseExpression | None:
    """The model whose `modules()` the innermost loop binding `name` walks."""
    for node in reversed(ctx.stack):
        if isinstance(node, LOOPS) and _parameter_name(node.target) == name:  # `m`, or `mn, m` of named_modules()
            call = node.iter
            walked = "named_modules" if isinstance(node.target, cst.Tuple) else "modules"
            if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == walked:
                return call.func.value
            return None
    return None


def _assigned_once(ctx, name: cst.Name) -> cst.BaseExpression | None:
    """The value of the only assignment to `name` in its scope (a plain `name = value`)."""
    scope = ctx.scope(name)
    assignments = list(scope[name.value]) if scope is not None else []
    if len(assignments) != 1:
        return None
    node = getattr(assignments[0], "node", None)
    function = next((n for n in reversed(ctx.stack) if isinstance(n, (cst.FunctionDef, cst.Module))), None)
    for statement, _ in walk(function.body if isinstance(function, cst.FunctionDef) else function):
        if isinstance(statement, cst.Assign) and len(statement.targets) == 1 and statement.targets[0].target is node:
            return statement.value
    return None


def _table_of_parameters(ctx, name: cst.Name) -> cst.BaseExpression | None:
    """The model whose parameters the dict `name` of the function around holds: built from them once
    (`{n: p for n, p in model.named_parameters()}`, `dict(model.named_parameters())`), and otherwise only
    filtered from itself (nanoGPT's `param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}`)."""
    function = next((n for n in reversed(ctx.stack) if isinstance(n, (cst.FunctionDef, cst.Module))), None)
    values = _values_assigned(ctx, function.body if isinstance(function, cst.FunctionDef) else function, name.value)
    models = []
    for value in values:
        if isinstance(value, cst.DictComp):
            source = value.for_in.iter
        elif isinstance(value, cst.Call) and ctx.matches(value.func, "builtins.dict") and len(value.args) == 1:
            source = value.args[0].value
        else:
            return None
        func = source.func if isinstance(source, cst.Call) else None
        if isinstance(func, cst.Attribute) and func.attr.value in _DICT_VIEWS and isinstance(func.value, cst.Name):
            if func.value.value != name.value:
                return None
            continue  # filtered from itself
        model = parameters_of(ctx, source, through_dict=False)
        if model is None:
            return None
        models.append(model)
    return models[0] if len(models) == 1 else None


def model_named(ctx, name: str) -> cst.BaseExpression | None:
    """The model whose parameter names the innermost loop (at the node visited) binding `name` walks: `for n, p in
    model.named_parameters()` (or a dict of them) binds `n`; also a full name spelt from it (`fpn = f"{mn}.{pn}"`)."""
    found, model = _looped_names(ctx, name)
    if found:
        return model
    for joined in _joined_names(ctx, name):  # `fpn = f"{mn}.{pn}"` of `for pn, p in m.named_parameters()`
        model = _looped_names(ctx, joined)[1]
        if model is not None:
            return model
    return None


def _looped_names(ctx, name: str) -> tuple[bool, cst.BaseExpression | None]:
    """(whether a loop binds `name` as a parameter's name, the model whose parameters it walks)."""
    for node in reversed(ctx.stack):
        if isinstance(node, LOOPS) and _binds_name(node.target, name):
            call = node.iter
            named = isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value != "parameters"
            model = parameters_source(ctx, call) if named else None
            # `m` of `for mn, m in model.named_modules()`: its names are parts of the model's
            return True, (_modules_of(ctx, model.value) or model) if isinstance(model, cst.Name) else model
    return False, None


def _joined_names(ctx, name: str) -> list[str]:
    """The names a variable assigned once in the innermost function spells a parameter's full name from
    (`fpn = f"{mn}.{pn}" if mn else pn`, `mn + "." + pn`)."""
    function = next((n for n in reversed(ctx.stack) if isinstance(n, cst.FunctionDef)), None)
    if function is None:
        return []
    values = [
        node.value
        for node, _ in walk(function.body)
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)
        and node.targets[0].target.value == name
    ]
    if len(values) != 1 or not isinstance(values[0], (cst.FormattedString, cst.BinaryOperation, cst.IfExp)):
        return []
    return [node.value for node, _ in walk(values[0]) if isinstance(node, cst.Name)]


def _binds_name(target: cst.BaseExpression, name: str) -> bool:
    return (
        isinstance(target, cst.Tuple)
        and len(target.elements) == 2
        and isinstance(target.elements[0].value, cst.Name)
        and target.elements[0].value.value == name
    )


def binds(target: cst.BaseExpression, name: str) -> bool:
    """`for p in ...` or `for n, p in ...` binds `name` to the parameter."""
    return _parameter_name(target) == name


def loop_target(loop) -> str | None:
    """The parameter's name in `for p in ...` / `for n, p in ...`."""
    return _parameter_name(loop.target)


def _parameter_name(target: cst.BaseExpression) -> str | None:
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    return target.value if isinstance(target, cst.Name) else None


def per_item(comprehension, loop: cst.CompFor) -> list:
    """What `comprehension` evaluates for each item of its `loop`: the element (a dict's key and value) and the
    loop's filters."""
    parts = [comprehension.key, comprehension.value] if isinstance(comprehension, cst.DictComp) else [comprehension.elt]
    return [*parts, *(test.test for test in loop.ifs)]


def handed_in(ctx, model) -> bool:
    """`model` is an argument of the function around (`self` included): a module this code is handed."""
    scope = ctx.scope(model) if isinstance(model, cst.Name) else None
    if scope is None:
        return False
    bindings = scope[model.value]
    return bool(bindings) and all(isinstance(getattr(b, "node", None), cst.Param) for b in bindings)
