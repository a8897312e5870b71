"""The files of one program rewritten in parallel, each parsed once by the process that keeps it.

A program's rewrite has two steps (analysis/program.py): rewrite every file,
join the facts, rewrite again the files the verdict changes. The second step
needs the parsed trees of the first, and sending trees between processes
costs more than parsing them. So each worker gets a fixed share of the files
(largest first, to even out the work), keeps its parsed trees, answers the
first step, waits for the verdicts, and answers the second.

A worker holds only its own end of its pipe: when the main process dies,
however it dies, the worker reads end-of-file and exits instead of waiting
forever.
"""

import os
from collections.abc import Mapping
import signal
from multiprocessing import get_context

from migrate_fsdp.lifeline import die_with_parent
from migrate_fsdp.rewrite.api import (
    ParsedFile,
    RewriteResult,
    decide_with_late_files,
    left_unchanged,
    rewrite_program,
    whole_or_untouched,
)
from migrate_fsdp.rewrite.diagnostics import Diagnostic
from migrate_fsdp.rewrite.selection import INTERNAL_ERROR, Selection

Job = tuple[str, bytes]  # shown path, contents


def rewrite_files(
    jobs: list[Job], selection: Selection, todo: bool, workers: int, sources: Mapping[str, bytes] | None = None
) -> list[RewriteResult]:
    """Rewrite `jobs` as one program, in `workers` processes (1: in this one); `sources`: every file of the
    program (jobs and those not worth parsing), by shown path."""
    workers = max(1, min(workers, len(jobs)))
    sources = sources if sources is not None else dict(jobs)
    if workers == 1:
        return rewrite_program([ParsedFile(data, path, selection, todo) for path, data in jobs], sources)
    shares = _shares(jobs, workers)
    context = get_context("fork")
    pipes, processes = [], []
    try:
        for share in shares:
            mine, theirs = context.Pipe()
            inherited = list(pipes)  # the main process's ends of earlier workers' pipes
            process = context.Process(target=_worker, args=(os.getpid(), theirs, mine, inherited, share, selection, todo), daemon=True)
            process.start()
            theirs.close()
            pipes.append(mine)
            processes.append(process)
        first = {}
        for pipe, share in zip(pipes, shares):
            first.update(_receive(pipe, share))
        verdicts, failure, late = decide_with_late_files(first, set(first), sources, selection, todo)  # few, parsed here
        if failure is not None:
            return [left_unchanged(first[path][0], failure) for path in [*(path for path, _ in jobs), *(f.path for f in late)]]
        for pipe, share in zip(pipes, shares):
            pipe.send({path: verdicts[path] for path, _ in share if path in verdicts})
        results = {path: result for path, (result, _) in first.items()}
        for pipe, share in zip(pipes, shares):
            for path, redone in _receive(pipe, share).items():
                if redone is not None:
                    results[path] = redone[0]
        for file in late:
            if file.path in verdicts:
                results[file.path] = file.rewrite(verdicts[file.path])[0]
        return whole_or_untouched([results[path] for path in [*(path for path, _ in jobs), *(f.path for f in late)]])
    finally:
        for pipe in pipes:
            pipe.close()
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()


def _shares(jobs: list[Job], workers: int) -> list[list[Job]]:
    shares: list[list[Job]] = [[] for _ in range(workers)]
    sizes = [0] * workers
    for job in sorted(jobs, key=lambda job: len(job[1]), reverse=True):
        smallest = sizes.index(min(sizes))
        shares[smallest].append(job)
        sizes[smallest] += len(job[1])
    return [share for share in shares if share]


def _receive(pipe, share: list[Job]) -> dict:
    try:
        return pipe.recv()
    except EOFError:  # the worker died (killed, out of memory): its files are left as they are
        message = "internal error (a worker process died); file left unchanged, please report it"
        return {
            path: (RewriteResult(path, data, data, [Diagnostic(path, 1, 1, INTERNAL_ERROR, message)]), None)
            for path, data in share
        }


def _worker(parent: int, pipe, own_other_end, inherited, share: list[Job], selection: Selection, todo: bool) -> None:
    die_with_parent(parent=parent)  # a parse can take seconds: end now, not at the next send
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the main process decides what an interrupt ends
    own_other_end.close()
    for other in inherited:
        other.close()
    try:
        files = {path: ParsedFile(data, path, selection, todo) for path, data in share}
        pipe.send({path: file.rewrite() for path, file in files.items()})
        verdicts = pipe.recv()
        pipe.send({path: files[path].rewrite(verdicts[path]) if path in verdicts else None for path in files})
    except (EOFError, BrokenPipeError):
        pass  # the main process is gone
    finally:
        os._exit(0)
