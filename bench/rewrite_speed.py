"""How fast `migrate-fsdp rewrite` goes over a big real tree, next to the reference tool.

Goal (issue 2): `rewrite --check` over the whole installed torch package in at
most 60 s on 2 cores, files without FSDP1 tokens costing next to nothing.

One run prints, side by side:
- migrate-fsdp over the whole torch tree and over torch/distributed;
- TorchFix (the archived LibCST-based PyTorch codemod; `pip install torchfix`,
  or point --torchfix at its executable) over torch/distributed: over the whole
  tree it takes tens of minutes, so the subtree is the common ground;
- wall time, peak RSS of the largest process, and lines a second;
- per-file time for every file that passes the byte prefilter (serial, one
  process, no pool), so slow files show.

Usage: python bench/rewrite_speed.py [--torchfix PATH] [--jobs N]
"""

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def torch_root() -> Path:
    spec = importlib.util.find_spec("torch")
    return Path(next(iter(spec.submodule_search_locations)))


def count_lines(root: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in root.rglob("*.py"))


# Runs one command and prints the largest ru_maxrss among its processes, so
# that each measurement has its own peak (RUSAGE_CHILDREN only ever grows).
_MEASURE = (
    "import resource, subprocess, sys\n"
    "status = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, status)\n"
)


def timed(command: list[str]) -> tuple[float, int, int]:
    """Wall seconds, peak RSS (MiB) of the largest process, exit status."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    peak_kib, status = map(int, out.split())
    return wall, peak_kib // 1024, status


def per_file_times(root: Path) -> list[tuple[float, int, str]]:
    from migrate_fsdp.rewrite.api import rewrite_source
    from migrate_fsdp.rewrite.files import discover
    from migrate_fsdp.rewrite.names import may_use_fsdp1

    rows = []
    for path in discover([str(root)], []):
        data = path.read_bytes()
        if not may_use_fsdp1(data):
            continue
        start = time.perf_counter()
        rewrite_source(data, str(path))
        rows.append((time.perf_counter() - start, data.count(b"\n"), str(path.relative_to(root))))
    return sorted(rows, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torchfix", default=shutil.which("torchfix"), help="TorchFix executable")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()

    root = torch_root()
    subtree = root / "distributed"
    ours = [sys.executable, "-m", "migrate_fsdp", "rewrite", "--check", "--jobs", str(args.jobs)]
    lines_all, lines_sub = count_lines(root), count_lines(subtree)
    print(f"torch tree: {root} ({lines_all:,} lines); subtree torch/distributed ({lines_sub:,} lines); {args.jobs} jobs")
    print(f"{'tool':<34} {'scope':<18} {'wall s':>8} {'peak MiB':>9} {'lines/s':>10}  exit")

    def row(tool, scope, lines, result):
        wall, peak, status = result
        print(f"{tool:<34} {scope:<18} {wall:8.1f} {peak:9d} {lines / wall:10,.0f}  {status}")
        return wall

    whole = row("migrate-fsdp rewrite --check", "torch (all)", lines_all, timed([*ours, str(root)]))
    sub = row("migrate-fsdp rewrite --check", "torch/distributed", lines_sub, timed([*ours, str(subtree)]))
    if args.torchfix:
        ref = row("torchfix (reference)", "torch/distributed", lines_sub,
                  timed([args.torchfix, "--jobs", str(args.jobs), str(subtree)]))
        print(f"\nspeed-up over TorchFix on torch/distributed: {ref / sub:.1f}x")
    else:
        print("\n(TorchFix not found: pip install torchfix, or pass --torchfix PATH)")
    verdict = "meets" if whole <= 60 else "MISSES"
    print(f"whole torch tree: {whole:.1f} s, goal <= 60 s on 2 cores: {verdict}")

    rows = per_file_times(root)
    total = sum(t for t, _, _ in rows)
    lines = sum(n for _, n, _ in rows)
    print(f"\nfiles passing the byte prefilter: {len(rows)} ({lines:,} lines), serial {total:.1f} s, "
          f"{1000 * total / max(lines, 1):.2f} ms a line")
    print(f"{'seconds':>8} {'lines':>7} {'ms/line':>8}  file")
    for seconds, n, name in rows:
        print(f"{seconds:8.2f} {n:7d} {1000 * seconds / max(n, 1):8.2f}  {name}")


if __name__ == "__main__":
    main()
