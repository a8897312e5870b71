"""Benchmark of `migrate-fsdp verify` on the bundled fixture suite, against just running the scripts.

    python bench/verify_suite.py [--hand-written] [--no-baseline] [--fixture NAME ...]

Runs the whole suite once through the real command (`python -m migrate_fsdp verify`, our rewrite
producing the FSDP2 side unless --hand-written) and prints its wall time against the goal (under
2 minutes on 2 idle CPU cores: issue 12), the CPU time it used and the load of the machine around it (the suite is
CPU-bound: other work on the machine stretches the wall time), then the per-fixture table of peak
memory and median step time of both versions as verify measured them.

The reference, run after it: each fixture's commands under plain torchrun (old and new, one after
the other, plus a resume fixture's save and convert steps), with no probe and no comparison: the
least any side-by-side check must spend. The difference is verify's own cost.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from migrate_fsdp.verify import suite
from migrate_fsdp.verify.table import fmt_bytes, fmt_time

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 120.0


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_verify(args: argparse.Namespace, report: Path) -> tuple[float, float, int]:
    command = [sys.executable, "-m", "migrate_fsdp", "verify", "--device", "cpu", "--report", str(report)]
    command += ["--hand-written"] if args.hand_written else []
    for name in args.fixture:
        command += ["--fixture", name]
    cpu, started = children_cpu_s(), time.monotonic()
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.monotonic() - started, children_cpu_s() - cpu, done.returncode


# gloo's teardown at interpreter exit aborts now and then (SIGABRT) after a script has done all its work;
# verify's probe never meets it (it ends each rank with os._exit). The run still did what is timed.
TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun(script: Path, args: list, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), *args], check=False, cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    if done.returncode != 0 and TEARDOWN_ABORT not in done.stderr + done.stdout:
        raise SystemExit(f"plain torchrun {script} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")


def new_script(fixture, hand_written: bool, scratch: Path) -> Path:
    if hand_written:
        return fixture.directory / "fsdp2.py"
    from migrate_fsdp.rewrite.api import rewrite_source

    source = (fixture.directory / "fsdp1.py").read_text(encoding="utf-8")
    target = scratch / f"{fixture.name}_fsdp2.py"
    target.write_text(rewrite_source(source, str(fixture.directory / "fsdp1.py")).code, encoding="utf-8")
    return target


def baseline(fixtures: list, hand_written: bool) -> float:
    """Wall time of running every fixture's commands under plain torchrun."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for fixture in fixtures:
            if fixture.kind == "resume":
                spec = {key: [arg.replace("{workdir}", tmp) for arg in fixture.spec[key]]
                        for key in ("save", "convert", "old", "new")}
                torchrun(fixture.directory / spec["save"][0], spec["save"][1:], fixture.directory)
                subprocess.run([sys.executable, "-m", "migrate_fsdp", "convert-ckpt", *spec["convert"]], check=True,
                               capture_output=True, cwd=REPO)
                for side in ("old", "new"):
                    torchrun(fixture.directory / spec[side][0], spec[side][1:], fixture.directory)
                continue
            args = fixture.spec.get("args", [])
            torchrun(fixture.directory / "fsdp1.py", args, fixture.directory)
            torchrun(new_script(fixture, hand_written, scratch), args, fixture.directory)
    return time.monotonic() - started


def table(report: dict) -> str:
    header = ["fixture", "steps", "setting", "peak old", "peak new", "mem", "step old", "step new", "speed", "verdict"]
    rows = [header]
    for pair in report["pairs"]:
        if "memory" not in pair:
            rows.append([pair["name"], "-", "-", "-", "-", "-", "-", "-", "-", pair["status"]])
            continue
        memory, speed = pair["memory"], pair["speed"]
        steps = len({(r["step"]) for r in pair["per_step"]})
        rows.append([
            pair["name"], str(steps), "exact" if pair["setting"]["exact"] else "toleranced",
            fmt_bytes(max(m["old_peak"] for m in memory)), fmt_bytes(max(m["new_peak"] for m in memory)),
            f"{max(m['ratio'] for m in memory):.2f}x", fmt_time(speed["old_median_s"]),
            fmt_time(speed["new_median_s"]), f"{speed['ratio']:.2f}x", pair["status"],
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hand-written", action="store_true", help="compare with the fixtures' own fsdp2.py")
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain-torchrun reference")
    parser.add_argument("--fixture", action="append", default=[], help="only this fixture (repeatable)")
    args = parser.parse_args()
    fixtures = suite.select(suite.discover(), tuple(args.fixture))
    if args.hand_written:
        fixtures = [f for f in fixtures if f.kind == "resume" or (f.directory / "fsdp2.py").is_file()]
        args.fixture = [f.name for f in fixtures]

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        wall, cpu, code = run_verify(args, report_path)
        report = json.loads(report_path.read_text()) if report_path.exists() else {"pairs": []}
    load_after = os.getloadavg()[0]
    against = "hand-written fsdp2.py" if args.hand_written else "our rewrite"
    print(f"migrate-fsdp verify, {len(fixtures)} fixtures (fsdp1.py against {against}), 2 ranks each, "
          f"{os.cpu_count()} CPU cores")
    print(table(report))
    print()
    print(f"{'':26}{'wall':>9}{'cpu':>9}")
    print(f"{'migrate-fsdp verify':26}{wall:8.1f}s{cpu:8.1f}s   exit {code}; goal: wall < {GOAL_S:.0f}s "
          f"({'met' if wall < GOAL_S else 'MISSED'}); load average {load_before:.1f} before, {load_after:.1f} after")
    if not args.no_baseline:
        cpu = children_cpu_s()
        reference = baseline(fixtures, args.hand_written)
        print(f"{'plain torchrun, no probe':26}{reference:8.1f}s{children_cpu_s() - cpu:8.1f}s   "
              f"verify / plain: {wall / reference:.2f}x")
    return code


if __name__ == "__main__":
    sys.exit(main())
