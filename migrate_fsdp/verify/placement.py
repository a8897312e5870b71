"""Where the two runs go: CPU or GPU, and with enough GPUs, both at once on disjoint sets.

Two runs of N ranks each fit side by side on 2N GPUs; each then sees only its
own N through CUDA_VISIBLE_DEVICES and gets its own rendezvous port (torchrun
--standalone picks a free one). With fewer GPUs, or with the user's own
rendezvous flags (across nodes this process cannot see the other nodes' GPUs;
on one node a given --rdzv-endpoint or --master-port would be claimed by both
runs at once), the runs take turns on the same N.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from migrate_fsdp.verify.errors import VerifyError


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" or "cuda"
    concurrent: bool
    old_env: dict = field(default_factory=dict)
    new_env: dict = field(default_factory=dict)

    def describe(self) -> str:
        if self.device == "cpu":
            return "cpu (gloo), one run after the other"
        if self.concurrent:
            return (f"cuda, side by side: old on GPUs {self.old_env['CUDA_VISIBLE_DEVICES']}, "
                    f"new on GPUs {self.new_env['CUDA_VISIBLE_DEVICES']}")
        return f"cuda on GPUs {self.old_env['CUDA_VISIBLE_DEVICES']}, one run after the other"


def visible_gpus(environ=os.environ) -> list[str]:
    """The GPUs this process may hand out, named as CUDA_VISIBLE_DEVICES names them."""
    count = _gpu_count()
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [name.strip() for name in listed.split(",") if name.strip()][:count]


def _gpu_count() -> int:
    # Importing torch costs seconds; skip it on machines with no GPU driver at all.
    if not (Path("/proc/driver/nvidia/gpus").is_dir() or Path("/dev/kfd").exists()):
        return 0
    import torch

    return torch.cuda.device_count()


def plan(device: str, nproc: int, gpus: list[str], standalone: bool) -> Placement:
    if device == "auto":
        device = "cuda" if len(gpus) >= nproc else "cpu"
    if device == "cpu":
        hide = {"CUDA_VISIBLE_DEVICES": ""}
        return Placement("cpu", concurrent=False, old_env=hide, new_env=dict(hide))
    if len(gpus) < nproc:
        raise VerifyError(f"--device cuda needs {nproc} GPUs (one per rank, --nproc {nproc}); {len(gpus)} visible")
    if standalone and len(gpus) >= 2 * nproc:
        return Placement(
            "cuda",
            concurrent=True,
            old_env={"CUDA_VISIBLE_DEVICES": ",".join(gpus[:nproc])},
            new_env={"CUDA_VISIBLE_DEVICES": ",".join(gpus[nproc : 2 * nproc])},
        )
    same = {"CUDA_VISIBLE_DEVICES": ",".join(gpus[:nproc])}
    return Placement("cuda", concurrent=False, old_env=same, new_env=dict(same))
