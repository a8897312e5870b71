"""A rewrite run over many files: cheap filtering first, parsing in parallel, writing last.

Reading bytes and testing them costs microseconds a file; parsing and scope
analysis cost about a millisecond a line. So every file is read and tested
here, and only the few that can hold FSDP1 code go to the worker processes,
largest first so that two cores finish together.
"""

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from migrate_fsdp.lifeline import with_lifeline
from migrate_fsdp.rewrite.api import RewriteResult, rewrite_source, worth_parsing
from migrate_fsdp.rewrite.files import discover, is_generated, read_each, write_changed
from migrate_fsdp.rewrite.selection import Selection


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


# Worker state: set once per process, not pickled with every file.
_worker_options: tuple = ()


def _init_worker(selection: Selection, todo: bool) -> None:
    global _worker_options
    _worker_options = (selection, todo)


def _rewrite_one(job: tuple[str, bytes]) -> RewriteResult:
    shown, data = job
    selection, todo = _worker_options
    return rewrite_source(data, shown, selection, todo)


def run(paths: list[str], selection: Selection, *, exclude: list[str], jobs: int, todo: bool, write: bool) -> RunResult:
    files = discover(paths, exclude)
    jobs_to_do, unreadable = [], []
    for path, data in read_each(files, unreadable, display_path):
        if is_generated(data) or not worth_parsing(data, selection):
            continue
        jobs_to_do.append((display_path(path), data))
    jobs_to_do.sort(key=lambda job: len(job[1]), reverse=True)

    _init_worker(selection, todo)
    workers = min(jobs, len(jobs_to_do))
    if workers > 1:
        with ProcessPoolExecutor(
            workers, mp_context=get_context("fork"),
            initializer=with_lifeline, initargs=(os.getpid(), _init_worker, selection, todo),
        ) as pool:
            try:
                results = list(pool.map(_rewrite_one, jobs_to_do))
            except BaseException:  # interrupted: wait for the files being parsed, not for the whole queue
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    else:
        results = [_rewrite_one(job) for job in jobs_to_do]
    results = sorted(results + unreadable, key=lambda r: r.path)

    if write:
        write_changed(results)
    return RunResult(scanned=len(files), results=results)


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
