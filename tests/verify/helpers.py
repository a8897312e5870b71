"""Helpers for verify's tests: the CLI in a subprocess, and synthetic runs for the comparison."""

import copy
import subprocess
import sys
from pathlib import Path

from migrate_fsdp.verify.launcher import Launch, Run, Side
from migrate_fsdp.verify.metrics import RankMetrics
from migrate_fsdp.verify.placement import Placement

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "fixtures" / "train"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def verify(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    """`migrate-fsdp verify ARGS` on CPU, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "verify", "--device", "cpu", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )


def unit(origin="FSDP1 FULL_SHARD", **changes) -> dict:
    settings = {"shard_size": 2, "replicate_size": 1, "reshard_after_forward": True, "param_dtype": "float32",
                "reduce_dtype": "float32", "offload_params": False, "origin": origin}
    return {**settings, **changes}


def step(k: int, loss: float, **changes) -> dict:
    record = {"step": k, "optimizer": 0, "loss": loss, "loss_abs": abs(loss), "loss_dtype": "float32", "backwards": 1,
              "unsynced_backwards": 0, "grad_norm": 1.0 + k, "grad_digest": [k, 1], "grad_numel": 1000,
              "clip": None, "param_norm": 10.0 + k, "param_digest": [k, 2], "param_numel": 1000,
              "time_s": 0.01, "peak_bytes": 1000, "instrumented": False}
    return {**record, **changes}


def run(name: str, losses: list, units: dict | None = None, world: int = 2, **step_changes) -> Run:
    """A completed run whose every rank saw `losses` (one per step)."""
    units = units if units is not None else {"": unit(reshard_after_forward=False), "layers.0": unit()}
    if name == "new":
        units = {fqn: {**u, "origin": "FSDP2"} for fqn, u in units.items()}
    setup = {"optimizer_index": 0, "device": "cpu", "backend": "gloo", "world_size": world, "optimizer": "AdamW",
             "units": units}
    ranks = []
    for rank in range(world):
        metrics = RankMetrics(rank=rank, world_size=world, started=True, setups=[copy.deepcopy(setup)])
        metrics.steps = [step(k, loss, **step_changes) for k, loss in enumerate(losses)]
        metrics.end = {"status": "stopped", "steps": len(losses)}
        ranks.append(metrics)
    return Run(Side(name, Path(f"{name}.py")), Path("."), 0, False, 1.0, ranks)


def launch(steps: int = 3) -> Launch:
    return Launch(nproc=2, steps=steps, timeout=60)


CPU = Placement("cpu", concurrent=False, old_env={"CUDA_VISIBLE_DEVICES": ""}, new_env={"CUDA_VISIBLE_DEVICES": ""})
