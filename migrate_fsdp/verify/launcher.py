"""Launching the two versions under torchrun, each rank inside the probe, with a deadline.

Each launch is a torchrun process in a new session; its ranks (which torchrun
puts in sessions of their own) are tracked while it runs so that a hang past
--timeout, or anything a finished run leaves behind, can be ended completely.
Should verify itself be killed (SIGKILL, nothing to clean up with), torchrun
gets SIGTERM from the kernel and its ranks die with it.
"""

import functools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from migrate_fsdp.lifeline import die_with_parent
from migrate_fsdp.verify import metrics, processes
from migrate_fsdp.verify.timeouts import Pace, Watchdog

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_POLL_S = 0.2


@dataclass
class Side:
    """One version of the training code, as torchrun will run it."""

    name: str  # "old" or "new"
    script: Path
    args: list = field(default_factory=list)
    shown: str = ""  # how reports name it
    watched: bool = True  # False: a set-up step, run without the probe (script_entry.py)
    env: dict = field(default_factory=dict)  # set for this side only (a control run's perturbation)

    def __post_init__(self):
        self.shown = self.shown or str(self.script)


@dataclass
class Launch:
    nproc: int
    steps: int | None  # None: let the script train to its own end
    timeout: float | None  # None: a run is hung when it stops making progress (see timeouts)
    rendezvous: list = field(default_factory=list)  # torchrun's own flags, passed through as [flag, value]
    progress: object = None  # a progress.LiveLine on a terminal

    @property
    def standalone(self) -> bool:
        """torchrun --standalone: each run picks a free port of its own."""
        return not self.rendezvous

    @property
    def multi_node(self) -> bool:
        return any(flag == "--nnodes" and value != "1" for flag, value in self.rendezvous)

    def torchrun_flags(self, side: str) -> list[str]:
        if not self.rendezvous:
            return ["--standalone"]
        flags = []
        for flag, value in self.rendezvous:
            # Both versions rendezvous through the same endpoint one after the other.
            flags += [flag, f"{value}-{side}" if flag == "--rdzv-id" else value]
        return flags


@dataclass
class Run:
    side: Side
    directory: Path
    returncode: int | None
    timed_out: bool
    wall_s: float
    ranks: list
    hang: str = ""  # why it was ended as hung

    @property
    def torchrun_log(self) -> Path:
        return self.directory / "torchrun.log"


class _Running:
    def __init__(self, side: Side, launch: Launch, env: dict, directory: Path, pace: Pace):
        self.side = side
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        # A kept --logs directory may hold an earlier run's files; the probe appends to its metrics file.
        for stale in directory.glob("rank*.*"):
            stale.unlink()
        entry = ["-m", "migrate_fsdp.verify.probe" if side.watched else "migrate_fsdp.verify.script_entry"]
        command = [
            sys.executable, "-m", "torch.distributed.run", *launch.torchrun_flags(side.name),
            "--nproc-per-node", str(launch.nproc), *entry, str(side.script), *side.args,
        ]
        self.log = open(directory / "torchrun.log", "wb")  # noqa: SIM115 - closed in finish()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, os.getpid()),
        )  # SIGTERM, not SIGKILL: torchrun then ends its ranks (which also die with it, see probe)
        self.seen = {}
        self.timed_out = False
        self.hang = ""
        self.watchdog = Watchdog(directory, launch.timeout, pace, side.watched, self.started)

    def poll(self) -> bool:
        """Record the process tree; True once torchrun has exited."""
        self.seen.update(processes.descendants(self.proc.pid))
        return self.proc.poll() is not None

    def kill(self) -> None:
        """Past the deadline: end the run with every process it started."""
        self.timed_out = True
        self.hang = self.watchdog.why()
        self.end()

    def end(self) -> None:
        processes.end_all(self.proc.pid, self.seen)
        self.proc.wait()

    def finish(self, launch: Launch) -> Run:
        wall = time.monotonic() - self.started
        # A finished torchrun may still leave something behind (a script's daemon).
        if processes.leftovers(self.seen):
            processes.end_all(self.proc.pid, processes.leftovers(self.seen), grace=1.0)
        self.log.close()
        return Run(self.side, self.directory, self.proc.returncode, self.timed_out, wall,
                   _read_ranks(self.directory, launch), self.hang)


def _read_ranks(directory: Path, launch: Launch) -> list:
    found = {int(p.stem.removeprefix("rank")) for p in directory.glob("rank*.stderr")}
    if not launch.multi_node:
        found |= set(range(launch.nproc))
    return [metrics.read_rank(metrics.metrics_path(directory, rank), rank) for rank in sorted(found)]


def _environment(side: Side, launch: Launch, placement_env: dict, directory: Path, device: str) -> dict:
    env = dict(os.environ)
    env.update(placement_env)
    env.update(side.env)
    env[metrics.ENV_DIR] = str(directory)
    env[metrics.ENV_STEPS] = str(launch.steps or "")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_ROOT, env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would pick, without its warning
    if device == "cuda":
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    return env


def run_sides(sides: list, launch: Launch, placement, workdir: Path) -> list:
    """Run the sides (together when the placement allows it, else in turn); one Run each."""
    pace = Pace()  # a later side is judged by the pace of the earlier ones

    def start(side):
        directory = workdir / side.name
        placement_env = placement.new_env if side.name == "new" else placement.old_env
        env = _environment(side, launch, placement_env, directory, placement.device)
        return _Running(side, launch, env, directory, pace)

    batches = [sides] if placement.concurrent else [[side] for side in sides]
    runs = []
    for batch in batches:
        running = []
        try:
            for side in batch:
                running.append(start(side))
            _wait(running, launch.progress)
        except BaseException:
            # verify itself is interrupted (Ctrl-C, SIGTERM): the ranks live in sessions of their own, which
            # the signal does not reach, so they would train on (or hang) without it.
            for r in running:
                r.end()
            raise
        finally:
            if launch.progress is not None:
                launch.progress.clear()
        runs += [r.finish(launch) for r in running]
    return runs


def _wait(running: list, progress=None) -> None:
    """Until every run has ended; one its watchdog finds hung is killed."""
    pending = list(running)
    while pending:
        pending = [r for r in pending if not r.poll()]
        if progress is not None:
            progress.update(running)
        for r in [r for r in pending if r.watchdog.hung()]:
            r.kill()
            pending.remove(r)
        if pending:
            time.sleep(_POLL_S)
