"""Which files a run looks at, reading them, and writing them back safely.

Symbolic links met while walking a directory are skipped, as ruff and black
do: the file they point to is either in the tree already or not the user's to
rewrite. A link named on the command line is followed, and its target
rewritten; the link stays a link. A file that cannot be read or written is one
MF003 finding, and the run goes on.
"""

import fnmatch
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from migrate_fsdp.rewrite.api import RewriteResult
from migrate_fsdp.rewrite.diagnostics import Diagnostic
from migrate_fsdp.rewrite.selection import IO_ERROR
from migrate_fsdp.stale import remove_stale

# Directories that never hold the user's own training code.
_SKIPPED_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".venv", "venv", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", "node_modules", ".eggs",
    }
)
# Build outputs, unless the project names a package so (`src/pkg/dist/__init__.py`, its distributed code): a
# skipped module of the program would keep FSDP1 code beside the converted rest.
_BUILD_DIRS = frozenset({"build", "dist"})
GENERATED_MARKER = b"@" + b"generated"  # spelled apart so this file is not itself "generated"
TEMP_SUFFIX = ".migrate-fsdp.tmp"
# `.train.py.<pid>-<random>.migrate-fsdp.tmp`: the writer's PID tells a killed run's temporary from a live one's.
_TEMP_NAME = re.compile(r"\..+\.(?P<pid>\d+)-[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))


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
    if path.name in _BUILD_DIRS:
        return not (path / "__init__.py").exists()
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
                if name.endswith(".py") and not path.is_symlink() and not _excluded(path, root, exclude):
                    found.add(path)
    return sorted(found)


def is_generated(source: bytes) -> bool:
    return GENERATED_MARKER in source


def read_each(
    paths: list[Path], failures: list[RewriteResult], shown: Callable[[Path], str]
) -> Iterator[tuple[Path, bytes]]:
    """(path, bytes) for each file that can be read; each one that cannot becomes an MF003 result in `failures`."""
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as error:
            name = shown(path)
            message = f"cannot read: {error.strerror or error}; file skipped"
            failures.append(RewriteResult(name, b"", b"", [Diagnostic(name, 1, 1, IO_ERROR, message)]))
            continue
        yield path, data


def write_changed(results: list[RewriteResult]) -> None:
    """Write every changed result. One that cannot be written gets an MF003 finding naming its path and counts as
    unchanged (the file is as it was); the others are written all the same."""
    cleaned: set[Path] = set()
    for result in results:
        if not result.changed:
            continue
        path = Path(result.path)
        if path.parent not in cleaned:
            cleaned.add(path.parent)
            remove_stale(str(path.parent), _TEMP_NAME)
        try:
            write_atomically(path, result.new_source)
        except OSError as error:
            message = f"cannot write: {error.strerror or error}; file left unchanged"
            result.diagnostics.append(Diagnostic(result.path, 1, 1, IO_ERROR, message))
            result.new_source = result.source


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves the old file or the new one, never half.

    Mode and owner are kept. A file with other hard links, or one whose owner cannot be given to a new file (the
    writer is neither root nor the owner), is written in place once the complete temporary proves the data fits:
    its other names see the new text, and only a kill during that last copy can leave it partial.
    """
    target = path.resolve() if path.is_symlink() else path  # a link named explicitly stays a link
    status = target.stat()
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}-", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, status.st_mode & 0o7777)
        if status.st_nlink > 1 or not _give_owner(temp, status):
            _overwrite(target, data)
            os.unlink(temp)
        else:
            os.replace(temp, target)
    except BaseException:
        if os.path.lexists(temp):
            os.unlink(temp)
        raise


def _give_owner(temp: str, status: os.stat_result) -> bool:
    written = os.stat(temp)
    if (written.st_uid, written.st_gid) == (status.st_uid, status.st_gid):
        return True
    try:
        os.chown(temp, status.st_uid, status.st_gid)
    except PermissionError:
        return False
    return True


def _overwrite(target: Path, data: bytes) -> None:
    """Write `data` through `target`'s own inode; the old text goes back if that fails part-way."""
    old = target.read_bytes()
    with open(target, "r+b") as handle:
        try:
            handle.write(data)
            handle.truncate()
            handle.flush()
            os.fsync(handle.fileno())
        except OSError:
            handle.seek(0)
            handle.write(old)
            handle.truncate()
            raise
