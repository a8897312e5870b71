"""The terminal view: the two runs side by side, step by step, then the checks and the verdict."""

_VERDICT = {"pass": "PASS", "fail": "FAIL (parity)", "error": "NOT RUN"}


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def fmt_time(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _diff(a, b, relative: bool) -> str:
    if a is None or b is None:
        return "-"
    d = abs(a - b) / abs(a) if relative and a else abs(a - b)
    return "0" if d == 0 else f"{d:.2g}"


def _columns(rows: list, header: list) -> list:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(c).rjust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def _failure_lines(outcome) -> list:
    lines = []
    for failure in outcome.failures:
        lines.append(f"  {failure.side}: {failure.message}")
        lines += [f"    | {line}" for line in failure.tail.splitlines()]
    return lines


def render_pair(outcome) -> str:
    lines = [f"{outcome.name}"]
    for run in outcome.runs:
        lines.append(f"  {run.side.name}: {run.side.shown} {' '.join(run.side.args)}".rstrip()
                     + f"  [{run.wall_s:.1f} s]")
    steps = f"{outcome.launch.steps} steps" if outcome.launch.steps else "all steps"
    lines.append(f"  {outcome.launch.nproc} ranks, {steps}, {outcome.placement.describe()}")
    if outcome.verdict is None:
        lines += _failure_lines(outcome)
        lines.append(f"  verdict: {_VERDICT[outcome.status]}")
        return "\n".join(lines)
    verdict = outcome.verdict
    lines.append(f"  setting: {verdict.setting.label()}")
    lines += [f"    note: {note}" for note in verdict.setting.notes]
    header = ["step", "loss old", "loss new", "|d loss|", "tol", "grad norm d", "param norm d", "peak old",
              "peak new", "time old", "time new", ""]
    rows = []
    for row in (r for r in verdict.steps if r["rank"] == verdict.steps[0]["rank"]):
        rows.append([row["step"], repr(row["loss_old"]), repr(row["loss_new"]),
                     _diff(row["loss_old"], row["loss_new"], False), f"{row['loss_tol']:.2g}",
                     _diff(row["grad_norm_old"], row["grad_norm_new"], True),
                     _diff(row["param_norm_old"], row["param_norm_new"], True),
                     fmt_bytes(row["peak_old"]), fmt_bytes(row["peak_new"]), fmt_time(row["time_old"]),
                     fmt_time(row["time_new"]), "" if row["ok"] else "<-"])
    lines.append(f"  rank {verdict.steps[0]['rank']} (norms relative, global over all ranks):")
    lines += ["    " + line for line in _columns(rows, header)]
    lines.append("  checks:")
    for check in verdict.checks:
        lines.append(f"    [{'ok' if check.passed else 'FAIL'}] {check.name}: {check.summary}")
    lines.append("  memory (peak per rank, old -> new):")
    for m in verdict.memory:
        flag = "  FLAG: more than 10% above the old peak" if m["flagged"] else ""
        lines.append(f"    rank {m['rank']}: {fmt_bytes(m['old_peak'])} -> {fmt_bytes(m['new_peak'])} "
                     f"({m['ratio']:.2f}x){flag}")
    speed = verdict.speed
    lines.append(f"  speed (median step): old {fmt_time(speed['old_median_s'])}, new {fmt_time(speed['new_median_s'])} "
                 f"({speed['ratio']:.2f}x)")
    lines += [f"  note: {n}" for n in verdict.notes]
    lines += [f"  warning: {w}" for w in verdict.warnings]
    lines.append(f"  verdict: {_VERDICT[outcome.status]}")
    return "\n".join(lines)


def render_suite(outcomes: list, wall_s: float) -> str:
    header = ["fixture", "setting", "units", "peak old", "peak new", "mem", "step old", "step new", "speed",
              "verdict"]
    rows = []
    for o in outcomes:
        v = o.verdict
        if v is None:
            rows.append([o.name, "-", "-", "-", "-", "-", "-", "-", "-", _VERDICT[o.status]])
            continue
        old_peak = max((m["old_peak"] for m in v.memory), default=None)
        new_peak = max((m["new_peak"] for m in v.memory), default=None)
        ratio = max((m["ratio"] for m in v.memory), default=None)
        units = next(c for c in v.checks if c.name == "sharded modules")
        rows.append([o.name, "exact" if v.setting.exact else "toleranced", "same" if units.passed else "DIFFER",
                     fmt_bytes(old_peak), fmt_bytes(new_peak), f"{ratio:.2f}x" if ratio else "-",
                     fmt_time(v.speed["old_median_s"]), fmt_time(v.speed["new_median_s"]),
                     f"{v.speed['ratio']:.2f}x", _VERDICT[o.status]])
    passed = sum(o.status == "pass" for o in outcomes)
    lines = _columns(rows, header)
    # A passing fixture shows only its row: its warnings (flagged memory, nondeterministic ops) go here.
    lines += [f"warning: {o.name}: {w}" for o in outcomes if o.verdict is not None for w in o.verdict.warnings]
    lines.append(f"{passed} of {len(outcomes)} fixtures pass; {wall_s:.1f} s")
    return "\n".join(lines)
