"""The FSDP2 side made on the fly: the script's whole project rewritten in a copy (see project.py).

The copy's script runs from the copy, so its sibling modules import in their
rewritten form. An incomplete rewrite is refused before anything runs: there
would be no FSDP2 version to compare.
"""

import shutil
from pathlib import Path

from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.launcher import Side
from migrate_fsdp.verify.project import in_project, mirror

_SHOWN_DIAGNOSTIC = 72  # characters of the first unconverted use quoted in the refusal


def _shown(diagnostic, copy: Path, root: Path, display_path) -> str:
    """The first unconverted use, at the user's path, cut to fit one short line (the path's start goes first)."""
    in_copy = (Path.cwd() / diagnostic.path).resolve().relative_to(copy.resolve())
    where = f"{display_path(root / in_copy)}:{diagnostic.line}:{diagnostic.col}"
    what = f"{diagnostic.code} {diagnostic.message}"
    room = max(_SHOWN_DIAGNOSTIC - len(what) - 2, len(in_copy.name) + 12)
    if len(where) > room:
        where = "..." + where[len(where) - room + 3 :]
    shown = f"{where}: {what}"
    return shown if len(shown) <= _SHOWN_DIAGNOSTIC else shown[: _SHOWN_DIAGNOSTIC - 3] + "..."


def rewritten_side(old_script: Path, root: Path, args: list, workdir: Path) -> Side:
    try:
        from migrate_fsdp.rewrite.runner import default_jobs, display_path, run
        from migrate_fsdp.rewrite.selection import Selection
    except ImportError as exc:
        raise VerifyError(f"the rewrite engine is not available ({exc}); pass the FSDP2 version with --new") from exc
    copy = workdir / "rewrite" / root.name
    shutil.rmtree(copy, ignore_errors=True)  # a kept --logs directory holds an earlier run's copy
    mirror(root, copy)
    result = run([str(copy)], Selection.from_prefixes(None, None), exclude=[], jobs=default_jobs(), todo=True,
                 write=True)
    if result.diagnostics:
        first = _shown(result.diagnostics[0], copy, root, display_path)
        count = len(result.diagnostics)
        raise VerifyError(f"the rewrite leaves {count} FSDP1 use{'s' if count > 1 else ''} unconverted ({first}); "
                          "rewrite a copy (migrate-fsdp rewrite DIR), fix its TODOs, rerun with --new DIR")
    if not result.changed:
        raise VerifyError(f"{root} has no FSDP1 code for the rewrite to convert; nothing to compare")
    return Side("new", in_project(old_script, root, copy), list(args), shown=f"rewrite of {old_script}")
