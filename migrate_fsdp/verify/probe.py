"""Run a training script in one torchrun rank, watched by global hooks; never edits the script.

Usage (by the launcher): torchrun ... -m migrate_fsdp.verify.probe SCRIPT [ARGS...]
with the MIGRATE_FSDP_VERIFY_* variables of `metrics` set. The rank's stdout
and stderr go to files beside its metrics, so two runs never interleave and a
crash can be reported with its own traceback.
"""

import os
import runpy
import sys
import time
import traceback
from pathlib import Path

from migrate_fsdp.lifeline import die_with_parent
from migrate_fsdp.verify import metrics, saves


def _redirect_output(directory: Path, rank: int) -> None:
    for fd, path in ((1, metrics.stdout_path(directory, rank)), (2, metrics.stderr_path(directory, rank))):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout.reconfigure(line_buffering=True)


def main(argv: list[str]) -> int:
    die_with_parent()  # a rank orphaned by a killed torchrun would train, or wait in a collective, forever
    script = os.path.abspath(argv[0])
    directory = Path(os.environ[metrics.ENV_DIR])
    rank = int(os.environ.get("RANK", "0"))
    _redirect_output(directory, rank)
    writer = metrics.MetricsWriter(metrics.metrics_path(directory, rank))
    writer.write("start", rank=rank, world_size=int(os.environ.get("WORLD_SIZE", "1")), pid=os.getpid())

    import torch
    import torch.distributed as dist

    from migrate_fsdp.verify.recorder import Recorder, StopTraining

    tracker = None
    if torch.cuda.is_available():
        # Both versions then run the same kernels the same way; see docs/verify.md.
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        from migrate_fsdp.verify.cpu_memory import StorageTracker

        tracker = StorageTracker()
        tracker.__enter__()
    from migrate_fsdp.verify.perturb import ENV as PERTURB_ENV
    from migrate_fsdp.verify.perturb import Perturbation

    perturbation = Perturbation(os.environ[PERTURB_ENV]) if os.environ.get(PERTURB_ENV) else None
    recorder = Recorder(writer, int(os.environ.get(metrics.ENV_STEPS) or 0) or None, tracker, perturbation)
    recorder.install()
    saves.install(writer)

    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(script)
    end = {"status": "finished"}
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except StopTraining:
        end = {"status": "stopped"}
    except SystemExit as exc:
        if exc.code not in (None, 0):
            code = exc.code if isinstance(exc.code, int) else 1
            end = {"status": "exit", "exit_code": code}
    except BaseException as exc:  # the script's own failure: report it, do not mask it
        traceback.print_exc()
        code = 1
        end = {"status": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0], "time": time.time()}
    recorder.close()
    writer.write("end", **end, **recorder.finish())
    writer.close()
    if end["status"] == "stopped" and dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # A script may leave non-daemon threads (data loaders, loggers) that would
    # keep a stopped run alive; everything worth keeping is written by now.
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
