"""A rewrite run over many files: cheap filtering first, parsing in parallel, writing last.

Reading bytes and testing them costs microseconds a file; parsing and scope
analysis cost about a millisecond a line. So every file is read and tested
here, and only the few that can hold FSDP1 code are parsed, together, as one
program (workers.py).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from migrate_fsdp.rewrite.api import RewriteResult, worth_parsing
from migrate_fsdp.rewrite.files import discover, is_generated, read_each, write_changed
from migrate_fsdp.rewrite.selection import Selection
from migrate_fsdp.rewrite.workers import rewrite_files


@dataclass
class RunResult:
    scanned: int = 0
    results: list[RewriteResult] = field(default_factory=list)  # files that were parsed, in path order

    @property
    def changed(self) -> list[RewriteResult]:
        return [r for r in self.results if r.changed]

    @property
    def diagnostics(self) -> list:
        return sorted(d for r in self.results for d in r.diagnostics)


def display_path(path: Path) -> str:
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def run(paths: list[str], selection: Selection, *, exclude: list[str], jobs: int, todo: bool, write: bool) -> RunResult:
    files = discover(paths, exclude)
    jobs_to_do, unreadable, others = [], [], {}
    for path, data in read_each(files, unreadable, display_path):
        if is_generated(data) or not worth_parsing(data, selection):
            others[display_path(path)] = path
            continue
        jobs_to_do.append((display_path(path), data))
    jobs_to_do.sort(key=lambda job: len(job[1]), reverse=True)

    sources = ProgramSources(dict(jobs_to_do), others)
    results = sorted(rewrite_files(jobs_to_do, selection, todo, jobs, sources) + unreadable, key=lambda r: r.path)

    if write:
        write_changed(results)
    return RunResult(scanned=len(files), results=results)


class ProgramSources(Mapping):
    """Every file of the program by shown path: the parsed ones held, the others read again when the program
    model asks (which functions the program names, which file a called function lives in): a tree's bytes are
    not kept for the few it needs."""

    def __init__(self, parsed: dict[str, bytes], others: dict[str, Path]) -> None:
        self._parsed, self._others = parsed, others

    def __getitem__(self, shown: str) -> bytes:
        if shown in self._parsed:
            return self._parsed[shown]
        try:
            return self._others[shown].read_bytes()
        except OSError:
            return b""  # gone since: it names nothing

    def __iter__(self):
        yield from self._parsed
        yield from self._others

    def __len__(self) -> int:
        return len(self._parsed) + len(self._others)


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
