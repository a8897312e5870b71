"""Which files a run looks at, and writing them back safely."""

import fnmatch
import os
import tempfile
from pathlib import Path

# Directories that never hold the user's own training code.
_SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".venv", "venv", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", "node_modules", "build", "dist", ".eggs",
    }
)
GENERATED_MARKER = b"@" + b"generated"  # spelled apart so this file is not itself "generated"


class PathError(ValueError):
    pass


def _excluded(path: Path, root: Path, patterns: list[str]) -> bool:
    try:
        relative = path.relative_to(root).as_posix()
    except ValueError:
        relative = path.as_posix()
    return any(
        fnmatch.fnmatch(relative, p) or fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(path.as_posix(), p)
        for p in patterns
    )


def skipped_dir(path: Path) -> bool:
    return path.name in _SKIPPED_DIRS or path.name.endswith(".egg-info") or (path / "pyvenv.cfg").exists()


def discover(paths: list[str], exclude: list[str]) -> list[Path]:
    """Python files under `paths`, sorted; files named explicitly are always taken."""
    found: set[Path] = set()
    for given in paths:
        root = Path(given)
        if root.is_file():
            if not _excluded(root, root.parent, exclude):
                found.add(root)
            continue
        if not root.is_dir():
            raise PathError(f"{given}: no such file or directory")
        for directory, subdirs, files in os.walk(root):
            here = Path(directory)
            subdirs[:] = sorted(
                d for d in subdirs if not skipped_dir(here / d) and not _excluded(here / d, root, exclude)
            )
            for name in files:
                path = here / name
                if name.endswith(".py") and not _excluded(path, root, exclude):
                    found.add(path)
    return sorted(found)


def is_generated(source: bytes) -> bool:
    return GENERATED_MARKER in source


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old file or the new one, never half."""
    mode = path.stat().st_mode & 0o7777
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".migrate-fsdp.tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
