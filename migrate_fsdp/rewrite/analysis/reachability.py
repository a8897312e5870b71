"""Functions no code of the program calls: their FSDP1 code cannot meet the program's models.

A checkpoint module often keeps functions nobody calls any more
(a `load_distributed_model_checkpoint` for a checkpoint format of the past, a
`scatter_full_optim_state_dict` whose result is never loaded), exported from a
package `__init__` and nothing else. Their FSDP1 code on a parameter cannot
be converted; counted as reachable, it would hold back every constructor whose
model leaves its file. A function the program never names cannot be handed a
model, so its code holds nothing back.

"Never names" is judged on the bytes of every file of the program (also the
files not parsed because they name no FSDP1): any occurrence of the name as a
word counts (in a comment, a string, an attribute of anything), except the
`def` itself, an unaliased `from ... import name` and an `__all__` entry.
Functions the program may reach without naming them never count as unnamed:
decorated ones (registries, entry points; a grad-mode decorator such as
`@torch.no_grad()` registers nothing), dunders, pytest's `test*` and
`pytest_*` functions, and methods of classes with a base class (framework
hooks such as `on_save_checkpoint`).
"""

import re
from collections import Counter
from collections.abc import Mapping

import libcst as cst

from migrate_fsdp.rewrite.syntax import dotted

_UNDECORATED_OK = ("staticmethod", "classmethod")
# Decorators that only set the grad mode around the call: they register the function nowhere.
_GRAD_MODES = ("torch.no_grad", "torch.inference_mode", "torch.enable_grad", "no_grad", "inference_mode")
_COLLECTED = ("test", "pytest_")  # run by pytest without being named


def declarations(module: cst.Module) -> Counter:
    """How many times each plain function's name occurs in the file without being a use of it."""
    found: Counter = Counter()
    _declare_block(module.body, found, in_based_class=False)
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                found.update(a.name.value for a in small.names if a.asname is None and isinstance(a.name, cst.Name))
            elif _is_all(small):
                found.update(_all_entries(small.value))
    return found


def unnamed(functions: set[str], declared: dict[str, Counter | None], sources: Mapping[str, bytes]) -> set[str]:
    """The names in `functions` that no file of the program uses.

    `declared`: path -> its declarations, None for a file the rewrite did not parse (it is parsed here only if it
    spells one of the names, as a package `__init__` re-exporting them does).
    """
    left = {name for name in functions if name}
    if not left:
        return left
    word = re.compile(rb"\b(" + b"|".join(re.escape(name.encode()) for name in sorted(left)) + rb")\b")
    for path, data in sources.items():  # each file read once, whatever the number of names
        found = Counter(match.decode() for match in word.findall(data))
        if not found:
            continue
        own = declared.get(path)
        if own is None:
            own = _declared_in_text(data)
        left -= {name for name, count in found.items() if count > own[name]}
        if not left:
            break
    return left


_IMPORTED = re.compile(rb"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.MULTILINE)
_ALL = re.compile(rb"^__all__[ \t]*\+?=[ \t]*[\[(]([^\])]*)[\])]", re.MULTILINE)
_DEFINED = re.compile(rb"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", re.MULTILINE)


def _declared_in_text(data: bytes) -> Counter:
    """`declarations` of a file the rewrite did not parse, read from its text (a package `__init__` re-exporting
    functions): `def name`, unaliased `from ... import name` and `__all__` entries. What the text hides counts
    as a use, the safe side: parsing every file that spells a common name would cost seconds."""
    found: Counter = Counter()
    found.update(name.decode() for name in _DEFINED.findall(data))
    for names in _IMPORTED.findall(data):
        for part in names.strip(b"()").split(b","):
            words = part.split()
            if len(words) == 1:
                found[words[0].decode()] += 1
    for entries in _ALL.findall(data):
        found.update(entry.strip().strip(b"\"'").decode() for entry in entries.split(b",") if entry.strip())
    return found


def _declare_block(body, found: Counter, in_based_class: bool) -> None:
    for statement in body:
        if isinstance(statement, cst.FunctionDef):
            if _plain(statement) and not in_based_class:
                found[statement.name.value] += 1
            _declare_block(_inner(statement.body), found, in_based_class=False)
        elif isinstance(statement, cst.ClassDef):
            based = any(not (isinstance(b.value, cst.Name) and b.value.value == "object") for b in statement.bases)
            _declare_block(_inner(statement.body), found, in_based_class=based or bool(statement.decorators))
        elif isinstance(statement, (cst.If, cst.Try, cst.With, cst.For, cst.While)):
            _declare_block(_inner(statement.body), found, in_based_class)
            orelse = getattr(statement, "orelse", None)
            while orelse is not None:
                _declare_block(_inner(orelse.body), found, in_based_class)
                orelse = getattr(orelse, "orelse", None)


def _plain(function: cst.FunctionDef) -> bool:
    name = function.name.value
    if name.startswith("__") and name.endswith("__") or name.startswith(_COLLECTED):
        return False
    return all(_only_wraps(d.decorator) for d in function.decorators)


def _only_wraps(decorator) -> bool:
    """`@staticmethod`, `@classmethod`, `@torch.no_grad()` (or `@torch.no_grad`)."""
    if isinstance(decorator, cst.Name) and decorator.value in _UNDECORATED_OK:
        return True
    if isinstance(decorator, cst.Call) and not decorator.args:
        decorator = decorator.func
    return dotted(decorator) in _GRAD_MODES


def _inner(body) -> list:
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def _is_all(small) -> bool:
    """`__all__ = [...]` or `__all__ += [...]`."""
    if isinstance(small, cst.Assign):
        targets = [t.target for t in small.targets]
    elif isinstance(small, cst.AugAssign):
        targets = [small.target]
    else:
        return False
    return any(isinstance(t, cst.Name) and t.value == "__all__" for t in targets)


def _all_entries(value) -> list[str]:
    if not isinstance(value, (cst.List, cst.Tuple)):
        return []
    return [e.value.evaluated_value for e in value.elements if isinstance(e.value, cst.SimpleString)]
