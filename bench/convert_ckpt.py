"""Benchmark of `migrate-fsdp convert-ckpt` against PyTorch's own converter and a plain copy, side by side.

    python bench/convert_ckpt.py [--gb 2] [--rounds 3] [--dir DIR] [--tiny 100000]

Generates a torch.save checkpoint of about --gb GB (dozens of model tensors plus AdamW state, as FSDP1's
FULL_STATE_DICT + FSDP.optim_state_dict saves it), then times, in interleaved rounds:
  cp+sync       cp SRC DST && sync DST: the floor for moving the bytes (syncing what it wrote, as
                convert-ckpt fsyncs what it writes)
  torch_to_dcp  python -m torch.distributed.checkpoint.format_utils torch_to_dcp SRC DST
  convert-ckpt  python -m migrate_fsdp convert-ckpt SRC DST
each from a cold page cache where possible (sync, then /proc/sys/vm/drop_caches when writable, else
posix_fadvise(DONTNEED) on the source), sampling the RssAnon of the whole process tree every 5 ms (ru_maxrss
would count the file pages of the source, which the kernel can drop at will). A last run of convert-ckpt on a
checkpoint a quarter the size shows whether its memory stays flat as the checkpoint grows, and a checkpoint of
--tiny tensors of 4 floats each (default 100,000) whether it stays flat in the number of tensors too, beside
torch_to_dcp (torch.load + dcp.save); `--gb 0` runs that last part only. Prints medians, ratios against the goals,
and removes every file it wrote.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

GOAL_VS_COPY, GOAL_VS_TORCH, GOAL_ANON_MB = 1.5, 0.4, 256
GOAL_TINY_MB = 128  # for 100,000 tiny tensors


def make_checkpoint(path: str, gigabytes: float) -> tuple[int, int]:
    """A FULL model + optimizer checkpoint of about `gigabytes` GB; returns (largest tensor bytes, tensor count)."""
    import torch

    layers = 32
    rows = 4096
    cols = max(1, int(gigabytes * 1e9 / 3 / 4 / layers / rows))  # model + exp_avg + exp_avg_sq, fp32
    generator = torch.Generator().manual_seed(0)
    model, state = {}, {}
    for layer in range(layers):
        for name, shape in ((f"layers.{layer}.weight", (rows, cols)), (f"layers.{layer}.bias", (rows,))):
            model[name] = torch.randn(shape, generator=generator)
            state[name] = {
                "step": torch.tensor(100.0),
                "exp_avg": torch.randn(shape, generator=generator),
                "exp_avg_sq": torch.rand(shape, generator=generator),
            }
    optimizer = {
        "state": state,
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1, "params": list(model)}],
    }
    torch.save({"model": model, "optimizer": optimizer, "epoch": 3, "rng_state": torch.get_rng_state()}, path)
    return rows * cols * 4, len(model) * 4 + 1


def make_tiny_checkpoint(path: str, tensors: int) -> None:
    """A model of `tensors` tensors of 4 floats: the shape where per-tensor costs dominate."""
    import torch

    torch.save({"model": {f"layers.{i}.weight": torch.full((4,), float(i)) for i in range(tensors)}, "epoch": 1}, path)


def cold_cache(source: str) -> str:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as file:
            file.write("3\n")
        return "drop_caches"
    except OSError:
        fd = os.open(source, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise(DONTNEED) on the source"


def _tree(pid: int) -> list[int]:
    pids, index = [pid], 0
    while index < len(pids):
        for task in os.listdir(f"/proc/{pids[index]}/task") if os.path.isdir(f"/proc/{pids[index]}/task") else ():
            try:
                with open(f"/proc/{pids[index]}/task/{task}/children") as file:
                    pids += [int(child) for child in file.read().split()]
            except OSError:
                pass
        index += 1
    return pids


def _rss_anon_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RssAnon MB summed over the process tree) of a command, which must succeed."""
    peak = [0]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def sample():
        while process.poll() is None:
            peak[0] = max(peak[0], sum(_rss_anon_kb(pid) for pid in _tree(process.pid)))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, stderr = process.communicate()
    seconds = time.perf_counter() - start
    sampler.join()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}): {stderr.decode()[-2000:]}")
    return seconds, peak[0] / 1024


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)
    os.sync()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=2.0, help="checkpoint size (default 2; 0: only the tiny tensors)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, medians reported (default 3)")
    parser.add_argument("--dir", default=None, help="where the temporary checkpoints go (default: the system temp dir)")
    parser.add_argument("--tiny", type=int, default=100_000, help="tensors of the many-tiny-tensors shape (0: skip)")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="convert-ckpt-bench-", dir=args.dir)
    try:
        run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: str, args) -> None:
    if args.gb:
        run_large(work, args)
    if args.tiny:
        run_tiny(work, args.tiny)


def run_large(work: str, args) -> None:
    source, small = os.path.join(work, "full.pt"), os.path.join(work, "quarter.pt")
    print(f"generating a {args.gb:g} GB checkpoint in {work} ...", flush=True)
    largest, count = make_checkpoint(source, args.gb)
    size = os.path.getsize(source)
    python = sys.executable
    tools = {
        "cp+sync": lambda dst: ["sh", "-c", f'cp "{source}" "{dst}" && sync "{dst}"'],
        "torch_to_dcp": lambda dst: [
            python,
            "-m",
            "torch.distributed.checkpoint.format_utils",
            "torch_to_dcp",
            source,
            dst,
        ],
        "convert-ckpt": lambda dst: [python, "-m", "migrate_fsdp", "convert-ckpt", source, dst, "-q"],
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
    method = ""
    for round_ in range(args.rounds):
        for name, command in tools.items():
            dst = os.path.join(work, "out")
            method = cold_cache(source)
            results[name].append(timed(command(dst)))
            _remove(dst)
        print(
            f"round {round_ + 1}/{args.rounds}: " + ", ".join(f"{n} {r[-1][0]:.2f} s" for n, r in results.items()),
            flush=True,
        )

    print("a quarter-size checkpoint, to see memory stay flat ...", flush=True)
    small_largest, _ = make_checkpoint(small, args.gb / 4)
    cold_cache(small)
    small_run = timed([python, "-m", "migrate_fsdp", "convert-ckpt", small, os.path.join(work, "small-out"), "-q"])
    _remove(os.path.join(work, "small-out"))

    wall = {name: statistics.median(r[0] for r in runs) for name, runs in results.items()}
    anon = {name: max(r[1] for r in runs) for name, runs in results.items()}
    print()
    print(
        f"checkpoint: {size / 1e9:.2f} GB, {count} tensors, largest {largest / 1e6:.0f} MB; cold cache by {method}; "
        f"median of {args.rounds} rounds"
    )
    print(f"{'':14}{'wall s':>9}{'GB/s':>8}{'peak RssAnon MB':>18}")
    for name in tools:
        print(f"{name:14}{wall[name]:9.2f}{size / 1e9 / wall[name]:8.2f}{anon[name]:18.0f}")
    ours = wall["convert-ckpt"]
    budget = GOAL_ANON_MB + largest / 2**20
    print()
    print(f"convert-ckpt / cp+sync      = {ours / wall['cp+sync']:.2f}  (goal <= {GOAL_VS_COPY})")
    print(f"convert-ckpt / torch_to_dcp = {ours / wall['torch_to_dcp']:.2f}  (goal <= {GOAL_VS_TORCH})")
    print(
        f"convert-ckpt peak RssAnon   = {anon['convert-ckpt']:.0f} MB  (goal <= {GOAL_ANON_MB} MB + largest tensor "
        f"{largest / 2**20:.0f} MB = {budget:.0f} MB)"
    )
    print(
        f"  at a quarter of the size  = {small_run[1]:.0f} MB ({os.path.getsize(small) / 1e9:.2f} GB checkpoint, "
        f"largest tensor {small_largest / 2**20:.0f} MB, {small_run[0]:.2f} s)"
    )


def run_tiny(work: str, count: int) -> None:
    print(f"{count} tiny tensors, to see memory stay flat in their number ...", flush=True)
    source = os.path.join(work, "tiny.pt")
    started = time.perf_counter()
    make_tiny_checkpoint(source, count)
    print(f"  generated with torch.save in {time.perf_counter() - started:.1f} s", flush=True)
    python = sys.executable
    tiny = {}
    for name in ("torch_to_dcp", "convert-ckpt"):
        command = [python, "-m", "torch.distributed.checkpoint.format_utils", "torch_to_dcp"]
        if name == "convert-ckpt":
            command = [python, "-m", "migrate_fsdp", "convert-ckpt", "-q"]
        cold_cache(source)
        tiny[name] = timed([*command, source, os.path.join(work, "tiny-out")])
        _remove(os.path.join(work, "tiny-out"))
    print()
    print(f"{count} tensors of 4 floats each")
    print(f"{'':14}{'wall s':>9}{'us/tensor':>11}{'peak RssAnon MB':>18}")
    for name, (seconds, peak) in tiny.items():
        print(f"{name:14}{seconds:9.2f}{seconds / count * 1e6:11.0f}{peak:18.0f}")
    print(f"convert-ckpt peak RssAnon   = {tiny['convert-ckpt'][1]:.0f} MB  (goal <= {GOAL_TINY_MB} MB at 100,000)")


if __name__ == "__main__":
    main()
