"""A model handed to a function of another module of the program: which file, which function, where it goes there.

`train(model, ...)` imported from `utils/train_utils.py` is the usual way a
training script hands its model on. Within one file escapes.py follows it;
across files the program resolves the call here, once every file is read:
the module the caller imports the function from is looked up among the
program's files (relative imports from the caller's package, absolute ones
by their path's tail, the caller's own directory first, as `python
script.py` puts it on sys.path), and the function's parameter is followed
in that file as escapes.py follows a local one. Anything not found for sure
(a module outside the program, two candidates, a class, a re-export) is out
of sight, as before.
"""

import os
from collections.abc import Mapping
from pathlib import PurePosixPath

import libcst as cst
from libcst.metadata import MetadataWrapper

from migrate_fsdp.rewrite.analysis.escapes import Reach, Remote, parameter_reach, transparent
from migrate_fsdp.rewrite.syntax import dotted


class RemoteCalls:
    """Resolves `Remote` calls against the program's files, parsing a callee's file at most once."""

    def __init__(self, sources: Mapping[str, bytes]) -> None:
        self.sources = sources
        self._paths = {_normal(path): path for path in sources}
        self._contexts: dict[str, object] = {}
        self._reached: dict[tuple, Reach | None] = {}

    def reach(self, caller: str, remote: Remote) -> tuple[str, Reach] | None:
        """(the callee's file, where the model goes there) or None when it is out of sight."""
        found = self._resolve(caller, remote.function)
        if found is None:
            return None
        path, name = found
        if remote.parameters:  # the function sees the model's parameters, not the model
            return path, Reach(callees=frozenset({name}))
        key = (path, name, remote.index, remote.keyword)
        if key not in self._reached:
            try:
                self._reached[key] = self._follow(path, name, remote)
            except Exception:  # a file our analysis cannot read (a bug of ours): the callee is out of sight, safely
                self._reached[key] = None
        reach = self._reached[key]
        if reach is None or (reach.returns and not remote.result_in_sight):
            return None
        return path, reach

    def _resolve(self, caller: str, qualified: str) -> tuple[str, str] | None:
        module, _, name = qualified.rpartition(".")
        candidates = self.module_paths(caller, module)
        if len(candidates) != 1:
            return None
        return candidates[0], name

    def module_paths(self, caller: str, module: str) -> list[str]:
        """The program's files that `module`, as `caller` imports it, may be (one when found for sure)."""
        here = PurePosixPath(_normal(caller)).parent
        if module.startswith("."):
            level = len(module) - len(module.lstrip("."))
            base = here
            for _ in range(level - 1):
                base = base.parent
            rest = module.lstrip(".")
            stem = base.joinpath(*rest.split(".")) if rest else base
            candidates = [p for p in (f"{stem}.py", f"{stem}/__init__.py") if _normal(p) in self._paths]
        else:
            tails = (module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py")
            candidates = [p for p in self._paths if any(p == t or p.endswith("/" + t) for t in tails)]
            if len(candidates) > 1:  # the caller's directory first, as sys.path[0] of a script

                def root(path: str) -> PurePosixPath:  # where the import finds it (`a/utils/__init__.py`: `a`)
                    tail = next(t for t in tails if path == t or path.endswith("/" + t))
                    return PurePosixPath(path[: len(path) - len(tail)].rstrip("/"))

                near = [p for p in candidates if root(p) == here]
                candidates = near or candidates
        return [self._paths[_normal(candidate)] for candidate in candidates]

    def _follow(self, path: str, name: str, remote: Remote) -> Reach | None:
        function = self.function(path, name)
        return None if function is None else parameter_reach(self.context(path), function, remote.index, remote.keyword)

    def function(self, path: str, name: str) -> cst.FunctionDef | None:
        """The module-level function `name` of `path`, when a call of it runs its body with the arguments given."""
        ctx = self.context(path)
        if ctx is None:
            return None
        return next(
            (s for s in ctx.module.body if isinstance(s, cst.FunctionDef) and s.name.value == name and transparent(ctx, s)),
            None,
        )

    def called(self, caller: str, qualified: str, depth: int = 0) -> tuple[str, cst.FunctionDef] | None:
        """(its file, the function) of the program that a call in `caller` of `qualified` (as imported) runs, also
        through a package's re-export (`from .fsdp_utils import hsdp_device_mesh` in its `__init__`)."""
        found = self._resolve(caller, qualified)
        function = None if found is None else self.function(*found)
        if function is not None:
            return found[0], function
        ctx = None if found is None or depth >= 4 else self.context(found[0])
        for statement in ctx.module.body if ctx is not None else ():
            for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    alias = next((a for a in small.names if _bound_name(a) == found[1]), None)
                    if alias is not None:
                        module = "." * len(small.relative) + (dotted(small.module) if small.module is not None else "")
                        return self.called(found[0], f"{module}.{dotted(alias.name)}", depth + 1)
        return None

    def context(self, path: str):
        """The file's analysis context (None when it cannot be read), built once."""
        if path not in self._contexts:
            from migrate_fsdp.rewrite.context import FileContext  # the engine's context, built only for callees

            try:
                module = cst.parse_module(self.sources[path])
                text = self.sources[path].decode(module.encoding, errors="replace")
                self._contexts[path] = FileContext(path, MetadataWrapper(module, unsafe_skip_copy=True), frozenset(), False, text)
            except (cst.ParserSyntaxError, UnicodeDecodeError, RecursionError, MemoryError):
                self._contexts[path] = None  # out of sight
        return self._contexts[path]


def _bound_name(alias: cst.ImportAlias) -> str:
    return alias.asname.name.value if alias.asname is not None else dotted(alias.name)


def _normal(path: str) -> str:
    return PurePosixPath(os.path.normpath(path).replace(os.sep, "/")).as_posix()
