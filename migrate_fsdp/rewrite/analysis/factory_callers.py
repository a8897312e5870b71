"""A model a factory function returns, followed to every place the program calls that function.

`def setup_model(): return FSDP(...)` in `common.py`, called as `model =
setup_model()` by `train.py` and by an `export.py` that names no FSDP at all:
the model reaches both, and an FSDP1 read there (`model.world_size`, a state
dict) would break or change on an FSDP2 model. Each call is found by the
function's name in the bytes of every file of the program (files naming no
FSDP are parsed here, once, only if they spell it), resolved to the factory's
module as remote_calls.py resolves a call, and followed as escapes.py follows a
constructor's value. The model is in sight only if every occurrence of the name
is the `def`, an import, or such a call whose value stays in sight; a factory
returning another's model (`def build(): return setup_model()`) is followed to
its own callers, a few levels deep.
"""

import io
import re
import tokenize
from collections.abc import Mapping

import libcst as cst

from migrate_fsdp.rewrite.analysis.escapes import Reach, escapes, factory
from migrate_fsdp.rewrite.analysis.reachability import declarations
from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls
from migrate_fsdp.rewrite.syntax import walk

_DEPTH = 3  # factories returning a factory's model, followed this far


def factory_callers(
    remote_calls: RemoteCalls, sources: Mapping[str, bytes], path: str, name: str, depth: int = 0, entered: set | None = None
) -> list[tuple[str, str, Reach]] | None:
    """(file, function holding the call ("" at module level), where the model goes from there) for every call of
    `name`, the module-level function of `path` returning the model; None when the model may go out of sight
    (`entered` gets the file of the call it goes out of sight from)."""
    word = re.compile(rb"\b" + re.escape(name.encode()) + rb"\b")
    found = []
    for caller, data in sources.items():
        if not word.search(data):
            continue
        spelled = _spelled(data, name)
        ctx = remote_calls.context(caller)
        if ctx is None:
            return None
        if caller != path and any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in ctx.module.body):
            continue  # a module defining its own function of that name (scripts of several programs in one tree)
        calls = 0
        for node, ancestors in walk(ctx.module):
            if not (isinstance(node, cst.Call) and calls_function(ctx, node.func, name, caller, path, remote_calls)):
                continue
            calls += 1
            reach = escapes(ctx, node, ancestors)
            if reach is None or reach.escaped:
                if entered is not None:
                    entered.add(caller)
                return None
            if reach.returns:  # handed back again: followed to that function's callers
                outer = (
                    factory_callers(remote_calls, sources, caller, factory(ancestors), depth + 1, entered)
                    if depth < _DEPTH
                    else None
                )
                if outer is None:
                    return None
                found += outer
            holder = next((n.name.value for n in reversed(ancestors) if isinstance(n, cst.FunctionDef)), "")
            found.append((caller, holder, reach))
        if spelled != calls + declarations(ctx.module)[name]:
            return None  # named otherwise: passed as a callback, a method of the same name, a string
    return found


def _spelled(data: bytes, name: str) -> int:
    """How many times the code spells `name`; comments and strings (`# set up in setup_model`) do not count."""
    try:
        return sum(1 for token in tokenize.tokenize(io.BytesIO(data).readline) if token.type == tokenize.NAME and token.string == name)
    except (tokenize.TokenError, SyntaxError):
        return len(re.findall(rb"\b" + re.escape(name.encode()) + rb"\b", data))


def calls_function(ctx, func, name: str, caller: str, path: str, remote_calls: RemoteCalls) -> bool:
    """Whether `func` is the function `name` of the module at `path`, as `caller` names it."""
    for qualified in ctx.qualified_names(func):
        module, _, called = qualified.rpartition(".")
        if called != name:
            continue
        if not module and caller == path or module and remote_calls.module_paths(caller, module) == [path]:
            return True
    return False
