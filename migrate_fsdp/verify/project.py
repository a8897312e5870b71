"""The project a training script belongs to, and a cheap copy of it for the rewrite to change.

A training script usually imports its model, wrapping policy and checkpoint
helpers from modules beside it, so the FSDP2 version is the whole project
rewritten, not the script alone. The project is the script's package root:
starting from the script's directory, every parent that is a package (holds
an `__init__.py`) belongs to it, and the first directory that is not one is
the root (for a script beside no `__init__.py`, its own directory). `--project
DIR` names it instead.

The copy holds real copies of the Python files only; every other file (data,
configs, weights) is a symbolic link to the original, so that a script that
reads files relative to `__file__` finds them, and a project with gigabytes of
data costs no more than its code.
"""

import os
import shutil
from pathlib import Path

from migrate_fsdp.rewrite.files import skipped_dir
from migrate_fsdp.verify.errors import VerifyError

_NEVER_COPIED = frozenset({"__pycache__"})  # the copy compiles its own; a link would mix the two versions' bytecode


def project_root(script: Path, given: Path | None = None) -> Path:
    script = script.resolve()
    if given is not None:
        root = given.resolve()
        if not root.is_dir():
            raise VerifyError(f"--project {given}: not a directory")
        if not script.is_relative_to(root):
            raise VerifyError(f"--project {given}: {script.name} is not inside it; name the directory that holds it")
        return root
    root = script.parent
    while (root / "__init__.py").is_file() and root.parent != root:
        root = root.parent
    return root


def in_project(script: Path, root: Path, other: Path) -> Path:
    """Where `script` of the project at `root` sits in another version of it (`--new DIR`, the rewrite's copy)."""
    return other / script.resolve().relative_to(root)


def mirror(root: Path, target: Path) -> None:
    """Copy the project's Python files to `target` and link everything else."""
    code_dirs = set()
    for here, subdirs, files in os.walk(root):
        here = Path(here)
        subdirs[:] = [d for d in subdirs if d not in _NEVER_COPIED and not skipped_dir(here / d)]
        if any(name.endswith(".py") for name in files):
            while here not in code_dirs:
                code_dirs.add(here)
                if here == root:
                    break
                here = here.parent
    code_dirs.add(root)
    for directory in code_dirs:
        destination = target / directory.relative_to(root)
        destination.mkdir(parents=True, exist_ok=True)
        for entry in directory.iterdir():
            if entry in code_dirs or entry.name in _NEVER_COPIED:
                continue
            if entry.suffix == ".py" and entry.is_file():
                shutil.copy2(entry, destination / entry.name)
            else:
                (destination / entry.name).symlink_to(entry.absolute())
