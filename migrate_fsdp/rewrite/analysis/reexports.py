"""What other files of the program import: the names they take from a module, so that the rewrite of that module
keeps their imports, and which modules they import at all.

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
from pathlib import PurePosixPath

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


_IMPORT = re.compile(rb"^[ \t]*import[ \t]+([^\n#;]*)", re.M)
_DYNAMIC = re.compile(rb"import_module|__import__|\brunpy\b|spec_from_file_location")


def imported_modules(graph: Mapping[str, set[str]]) -> set[str]:
    """The program's files another file imports (in `import_graph`): a module-level model of a file nothing imports
    is seen only by its own file."""
    return set().union(*graph.values())


def import_graph(sources: Mapping[str, bytes], remote_calls: RemoteCalls) -> dict[str, set[str]]:
    """Each file of the program -> the program's files it imports (`import a.b`, `from a import b`, `from . import
    b`, and the packages on the way); a file importing by a string (`importlib.import_module`) imports every module
    whose name it spells."""
    graph: dict[str, set[str]] = {path: set() for path in sources}
    by_name: dict[str, list[str]] = {}  # a module's own name (its package's, for an `__init__`) -> its files
    for path in sources:
        module = PurePosixPath(path)
        by_name.setdefault(module.parent.name if module.stem == "__init__" else module.stem, []).append(path)
    for importer, data in sources.items():
        if b"import" not in data:
            continue
        modules = []
        for module, listed in _from_imports(data):
            modules.append(module)
            joint = module if module.endswith(".") else module + "."
            modules += [joint + name for name in listed if name != "*"]
        for line in _IMPORT.findall(data):
            for item in line.decode("utf-8", "replace").split(","):
                module = item.split(" as ")[0].strip()
                modules += [".".join(module.split(".")[: i + 1]) for i in range(module.count(".") + 1)]
        found = graph[importer]
        for module in modules:
            found.update(path for path in remote_calls.module_paths(importer, module) if path != importer)
        if _DYNAMIC.search(data):
            for word in set(re.findall(rb"\w+", data)):
                found.update(path for path in by_name.get(word.decode("utf-8", "replace"), ()) if path != importer)
    return graph


def coresident(graph: Mapping[str, set[str]], starts: set[str]) -> set[str]:
    """The files that may run in one process with `starts`, so reach a model leaving sight there: those importing
    one of them (the entry points running it), and everything these import. Two scripts that only share a
    library run apart."""
    return _closure(graph, importing(graph, starts))


def importing(graph: Mapping[str, set[str]], starts: set[str]) -> set[str]:
    """`starts` and the files importing one of them, directly or through others: the entry points running them."""
    importers: dict[str, set[str]] = {}
    for path, targets in graph.items():
        for target in targets:
            importers.setdefault(target, set()).add(path)
    return _closure(importers, set(starts))


def _closure(edges: Mapping[str, set[str]], starts: set[str]) -> set[str]:
    seen, queue = set(starts), list(starts)
    while queue:
        for neighbour in edges.get(queue.pop(), ()):
            if neighbour not in seen:
                seen.add(neighbour)
                queue.append(neighbour)
    return seen


def _from_imports(data: bytes) -> Iterable[tuple[str, set[str]]]:
    """(module as written, names imported) of each `from M import a, b as c` line; `*` for a star import."""
    for match in _FROM_IMPORT.finditer(data):
        listed = match.group(2).decode("utf-8", "replace").strip("() \t\r\n").replace("\n", " ")
        names = {item.split(" as ")[0].strip() for item in listed.split(",")}
        yield match.group(1).decode("utf-8", "replace"), {name for name in names if name}
