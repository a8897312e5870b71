"""Names other files of the program import from a module, so that the rewrite of that module keeps their imports.

A module whose FSDP import goes unused once it is rewritten (`from torch.distributed.fsdp import
FullyShardedDataParallel as FSDP` in a package's `__init__.py`, whose own constructor converted) may still
serve another file's `from pkg import FSDP`: dropping the import there raises ImportError in that file.
A star import passes the names on: they are needed when a file takes them from the star-importing module in
turn, or that module's own code names them. The program's import lines are read from the bytes of every
file (those not parsed too), once, and their modules resolved among the program's files as remote_calls.py
resolves a called function's module.
"""

import re
from collections.abc import Iterable, Mapping

from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls

_FROM_IMPORT = re.compile(rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.M)


def imported_elsewhere(dropped: Mapping[str, set[str]], sources: Mapping[str, bytes], remote_calls: RemoteCalls) -> dict[str, frozenset]:
    """For each file of `dropped` (its module-level names whose imports the rewrite dropped), those another
    file takes from it: by name, or through a star import whose module passes them on."""
    names = set().union(*dropped.values()) if dropped else set()
    if not names:
        return {}
    mentions = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in sorted(names)) + rb")\b|\*")
    by_name: dict[str, set[str]] = {}  # module file -> names other files import from it
    stars: dict[str, set[str]] = {}  # module file -> files star-importing it
    own_uses: dict[str, bytes] = {}  # star-importing file -> its code outside from-import lines
    for importer in sources:
        data = sources[importer]
        if b"import" not in data or mentions.search(data) is None:
            continue
        for module, listed in _from_imports(data):
            for path in remote_calls.module_paths(importer, module):
                if path == importer:
                    continue
                if "*" in listed:
                    stars.setdefault(path, set()).add(importer)
                    own_uses[importer] = _FROM_IMPORT.sub(b"", data)
                else:
                    by_name.setdefault(path, set()).update(listed & names)

    def needed(path: str, name: str, seen: set) -> bool:
        if name in by_name.get(path, ()):
            return True
        seen.add(path)
        return any(
            re.search(rb"\b" + re.escape(name.encode()) + rb"\b", own_uses[star]) or needed(star, name, seen)
            for star in stars.get(path, ())
            if star not in seen
        )

    kept = {path: frozenset(name for name in found if needed(path, name, set())) for path, found in dropped.items()}
    return {path: found for path, found in kept.items() if found}


def _from_imports(data: bytes) -> Iterable[tuple[str, set[str]]]:
    """(module as written, names imported) of each `from M import a, b as c` line; `*` for a star import."""
    for match in _FROM_IMPORT.finditer(data):
        listed = match.group(2).decode("utf-8", "replace").strip("() \t\r\n").replace("\n", " ")
        names = {item.split(" as ")[0].strip() for item in listed.split(",")}
        yield match.group(1).decode("utf-8", "replace"), {name for name in names if name}
