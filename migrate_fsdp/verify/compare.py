"""The verdict on a pair of completed runs: parity checks, memory and speed."""

import statistics
from dataclasses import dataclass, field

from migrate_fsdp.verify import envelope, tolerance

MEMORY_FLAG_RATIO = 1.10  # a new peak more than 10% above the old one is flagged
_UNIT_FIELDS = ("shard_size", "replicate_size", "reshard_after_forward", "param_dtype", "reduce_dtype",
                "offload_params")


@dataclass
class Check:
    name: str
    passed: bool
    summary: str
    worst: dict | None = None  # the step and rank closest to (or furthest past) its tolerance


@dataclass
class Verdict:
    setting: tolerance.Setting
    checks: list
    steps: list  # per rank, per step: the compared values and tolerances
    memory: list  # per rank
    speed: dict
    warnings: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # facts about what was compared, not doubts about it

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)


def _setups(run) -> list:
    """The setup record of each optimizer, from the first rank that reported them."""
    return next((rank.setups for rank in run.ranks if rank.setups), [])


def _check_units(old_setups: list, new_setups: list) -> Check:
    problems, total = [], 0
    for index in range(max(len(old_setups), len(new_setups))):
        old = old_setups[index]["units"] if index < len(old_setups) else {}
        new = new_setups[index]["units"] if index < len(new_setups) else {}
        where = f"optimizer {index}: " if max(len(old_setups), len(new_setups)) > 1 else ""
        total += len(old)
        missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
        if missing:
            problems.append(f"{where}not sharded by the new version: " + ", ".join(_fqn(f) for f in missing))
        if extra:
            problems.append(f"{where}sharded only by the new version: " + ", ".join(_fqn(f) for f in extra))
        for fqn in sorted(set(old) & set(new)):
            for name in _UNIT_FIELDS:
                a, b = old[fqn].get(name), new[fqn].get(name)
                if a != b:
                    problems.append(f"{where}{_fqn(fqn)}: {name} {a} (old) vs {b} (new)")
    if problems:
        return Check("sharded modules", False, "; ".join(problems))
    return Check("sharded modules", True, f"{total} FSDP units, same modules and settings")


def _check_steps(old_steps: list, new_steps: list) -> Check:
    if len(old_steps) != len(new_steps):
        return Check("steps", False, f"old ran {len(old_steps)} optimizer steps, new ran {len(new_steps)}")
    for a, b in zip(old_steps, new_steps):
        if a["optimizer"] != b["optimizer"]:
            return Check("steps", False, f"step {a['step']}: old stepped optimizer {a['optimizer']}, "
                                         f"new stepped optimizer {b['optimizer']}")
    optimizers = len({s["optimizer"] for s in old_steps})
    return Check("steps", True, f"{len(old_steps)} optimizer steps" +
                 (f" of {optimizers} optimizers, in the same order" if optimizers > 1 else ""))


def _fqn(fqn: str) -> str:
    return fqn or "<root>"


def _check_sync(old_steps: list, new_steps: list) -> Check:
    pattern = [(s["backwards"], s["unsynced_backwards"]) for s in old_steps]
    other = [(s["backwards"], s["unsynced_backwards"]) for s in new_steps]
    for step, (a, b) in enumerate(zip(pattern, other)):
        if a != b:
            return Check("gradient sync", False,
                         f"step {step}: old ran {a[0]} backward calls, {a[1]} without gradient sync; "
                         f"new ran {b[0]}, {b[1]} without sync")
    backwards, unsynced = pattern[0] if pattern else (0, 0)
    return Check("gradient sync", True, f"{backwards} backward call(s) per step, {unsynced} without sync, alike")


class _Tracker:
    """The worst case of one compared quantity across steps and ranks."""

    def __init__(self, name: str, relative: bool):
        self.name, self.relative = name, relative
        self.failures, self.compared, self.worst, self.score = 0, 0, None, -1.0

    def add(self, step: int, rank: int, old, new, tol: float) -> bool:
        if old is None and new is None:
            return True
        self.compared += 1
        if old is None or new is None:
            diff, ok = float("inf"), False
        else:
            diff = abs(old - new)
            if self.relative:
                diff = diff / abs(old) if old else diff
            ok = diff <= tol
        score = float("inf") if not ok else (diff / tol if tol else 0.0)
        if not ok:
            self.failures += 1
        if score > self.score:
            self.score = score
            self.worst = {"step": step, "rank": rank, "old": old, "new": new, "diff": diff, "tolerance": tol,
                          "relative": self.relative}
        return ok

    def check(self) -> Check:
        kind = "relative " if self.relative else ""
        if self.failures:
            w = self.worst
            return Check(self.name, False, f"{self.failures} of {self.compared} differ beyond tolerance; first worst: "
                                           f"step {w['step']} rank {w['rank']} old {w['old']!r} new {w['new']!r} "
                                           f"({kind}diff {w['diff']:.3g} > {w['tolerance']:.3g})", self.worst)
        if self.worst and self.worst["tolerance"]:
            return Check(self.name, True, f"{self.compared} compared; largest {kind}diff {self.worst['diff']:.3g}, "
                                          f"{self.score:.0%} of its tolerance", self.worst)
        return Check(self.name, True, f"{self.compared} compared, all identical", self.worst)


class _Exact:
    """Bit-identical digests, compared only where the setting promises them."""

    def __init__(self, name: str):
        self.name, self.compared, self.failed_at = name, 0, None

    def add(self, step: int, old, new) -> bool:
        self.compared += 1
        if old != new and self.failed_at is None:
            self.failed_at = step
        return old == new

    def check(self) -> Check | None:
        if not self.compared:
            return None
        if self.failed_at is not None:
            return Check(self.name, False, f"not bit-identical from step {self.failed_at} on, where the setting "
                                           "requires it")
        return Check(self.name, True, f"bit-identical at all {self.compared} steps where the setting requires it")


def setting_of(old_run, new_run, asked: int | None) -> tuple:
    """(the numerical setting, the number of steps every rank of both runs has) over the compared steps."""
    steps = min(len(rank.steps[:asked]) for rank in old_run.ranks + new_run.ranks)
    setting = tolerance.detect(_setups(old_run), _setups(new_run), old_run.ranks[0].steps[:steps],
                               new_run.ranks[0].steps[:steps])
    return setting, steps


def compare(old_run, new_run, asked: int | None, control=None) -> Verdict:
    """Judge two completed runs over their first `asked` optimizer steps, or (None) all they ran.

    `control`: the old version's control run (envelope.py), which judges the steps from EARLY_STEPS on.
    """
    old_setups, new_setups = _setups(old_run), _setups(new_run)
    old_seq, new_seq = old_run.ranks[0].steps[:asked], new_run.ranks[0].steps[:asked]
    setting, steps = setting_of(old_run, new_run, asked)
    bounds = None
    if control is not None:
        steps = min([steps, *(len(rank.steps) for rank in control.ranks)])
        bounds = envelope.Envelope(envelope.gaps(old_run, control, steps))
        setting.notes.append(f"from step {envelope.EARLY_STEPS} on, judged against a control run (the old version "
                             f"with rounding-sized noise): within {envelope.FACTOR:g}x its gaps")

    def late(k: int) -> bool:
        return bounds is not None and k >= envelope.EARLY_STEPS
    checks = [_check_steps(old_seq, new_seq), _check_units(old_setups, new_setups),
              _check_sync(old_seq[:steps], new_seq[:steps])]
    loss = _Tracker("loss", relative=False)
    grad_norm, param_norm, clip_norm = (_Tracker(n, relative=True) for n in ("grad norm", "param norm", "clip norm"))
    grad_bits, param_bits = _Exact("gradient bits"), _Exact("parameter bits")
    rows = []
    for old_rank, new_rank in zip(old_run.ranks, new_run.ranks):
        for k, (a, b) in enumerate(zip(old_rank.steps[:steps], new_rank.steps[:steps])):
            loss_tol = tolerance.loss_tolerance(setting, k, a["loss_abs"], a["loss_dtype"])
            if late(k):
                loss_tol = bounds.bound("loss", envelope.loss_floor(a["loss_abs"], a["loss_dtype"]))
            row = {"rank": old_rank.rank, "step": k, "loss_old": a["loss"], "loss_new": b["loss"],
                   "loss_tol": loss_tol, "ok": loss.add(k, old_rank.rank, a["loss"], b["loss"], loss_tol)}
            if old_rank is old_run.ranks[0]:  # norms and digests are global: the same on every rank
                rtol = grad_rtol = tolerance.norm_rtol(setting, k, a["grad_numel"])
                if late(k):
                    floor = envelope.norm_floor(a["grad_numel"])
                    grad_rtol, rtol = (bounds.bound(name, floor) for name in ("grad norm", "param norm"))
                ok = grad_norm.add(k, 0, a["grad_norm"], b["grad_norm"], grad_rtol)
                ok &= param_norm.add(k, 0, a["param_norm"], b["param_norm"], rtol)
                if setting.before(k) + setting.eps(k) == 0:
                    ok &= grad_bits.add(k, a["grad_digest"], b["grad_digest"])
                    ok &= param_bits.add(k, a["param_digest"], b["param_digest"])
                if a.get("clip") and b.get("clip"):
                    ctol = tolerance.clip_rtol(setting, k, a["grad_numel"], a["clip"]["dtype"])
                    if late(k):
                        ctol = bounds.bound("clip norm", tolerance.clip_rounding(setting, a["grad_numel"],
                                                                                  a["clip"]["dtype"]))
                    ok &= clip_norm.add(k, 0, a["clip"]["total_norm"], b["clip"]["total_norm"], ctol)
                row.update(grad_norm_old=a["grad_norm"], grad_norm_new=b["grad_norm"],
                           param_norm_old=a["param_norm"], param_norm_new=b["param_norm"], norm_rtol=rtol,
                           grad_norm_rtol=grad_rtol)
                row["ok"] = row["ok"] and ok
            row.update(peak_old=a["peak_bytes"], peak_new=b["peak_bytes"], time_old=a["time_s"], time_new=b["time_s"])
            rows.append(row)
    checks += [t.check() for t in (loss, grad_norm, param_norm) if t.compared]
    checks += [c for c in (grad_bits.check(), param_bits.check()) if c]
    if clip_norm.compared:
        checks.append(clip_norm.check())
    drift = _check_drift(old_run, new_run, steps, bounds) if bounds is not None else None
    if drift is not None:
        checks.append(drift)
    memory = _memory(old_run, new_run, steps)
    warnings = [f"rank {m['rank']}: new peak memory {m['ratio']:.2f}x the old one" for m in memory if m["flagged"]]
    for name, run in (("old", old_run), ("new", new_run)):
        ops = sorted({op for rank in run.ranks for op in (rank.end or {}).get("nondeterministic_ops", [])})
        if ops:
            warnings.append(f"{name} run used CUDA ops without a deterministic implementation: {', '.join(ops)}")
    notes = []
    if asked and len(old_seq) == len(new_seq) < asked:
        notes.append(f"both versions ended after {len(old_seq)} optimizer steps, before the --steps {asked} cap; "
                     "those steps are compared")
    return Verdict(setting, checks, rows, memory, _speed(old_run, new_run, steps), warnings, notes)


def _check_drift(old_run, new_run, steps: int, bounds) -> Check | None:
    """The mean signed gap of each quantity over the long run, against the control's spread."""
    first = old_run.ranks[0].steps
    floors = {"loss": envelope.loss_floor(first[0]["loss_abs"], first[0]["loss_dtype"]),
              "grad norm": envelope.norm_floor(first[0]["grad_numel"]),
              "param norm": envelope.norm_floor(first[0]["grad_numel"]),
              "clip norm": envelope.norm_floor(first[0]["grad_numel"])}
    new_gaps = envelope.gaps(old_run, new_run, steps)
    judged, failed, closest = [], [], None
    for name in envelope.QUANTITIES:
        result = envelope.drift(name, new_gaps[name], bounds, floors[name])
        if result is None:
            continue
        passed, mean, bound = result
        judged.append(name)
        share = abs(mean) / bound if bound else 0.0
        if not passed:
            failed.append(f"{name} {mean:+.3g} > {bound:.3g}")
        if closest is None or share > closest[1]:
            closest = (name, share, mean, bound)
    since = f"from step {envelope.EARLY_STEPS}"
    if not judged:
        return None
    if failed:
        return Check("drift", False, f"mean signed gap {since} beyond {envelope.FACTOR:g}x the control's spread: "
                                     + "; ".join(failed) + " (a systematic difference, not rounding)")
    name, share, mean, bound = closest
    return Check("drift", True, f"{len(judged)} quantities, mean signed gap {since} within {envelope.FACTOR:g}x the "
                                f"control's spread; closest: {name} {mean:+.3g}, {share:.0%} of {bound:.3g}")


def _memory(old_run, new_run, steps: int) -> list:
    out = []
    for old_rank, new_rank in zip(old_run.ranks, new_run.ranks):
        old = [s["peak_bytes"] for s in old_rank.steps[:steps] if s["peak_bytes"] is not None]
        new = [s["peak_bytes"] for s in new_rank.steps[:steps] if s["peak_bytes"] is not None]
        if not (old and new):
            continue
        ratio = max(new) / max(old) if max(old) else float("inf")
        out.append({"rank": old_rank.rank, "old_peak": max(old), "new_peak": max(new), "ratio": ratio,
                    "flagged": ratio > MEMORY_FLAG_RATIO})
    return out


def _median_step_time(run, steps: int) -> float:
    """Median over the steps that best show the steady state.

    The slowest rank sets the pace of a step; the first step pays for lazy
    initialisation; steps with CPU memory accounting carry its cost.
    """
    per_step = [(max(rank.steps[k]["time_s"] for rank in run.ranks),
                 any(rank.steps[k].get("instrumented") for rank in run.ranks)) for k in range(steps)]
    later = per_step[1:] or per_step
    clean = [t for t, instrumented in later if not instrumented]
    return statistics.median(clean or [t for t, _ in later])


def _speed(old_run, new_run, steps: int) -> dict:
    old, new = _median_step_time(old_run, steps), _median_step_time(new_run, steps)
    return {"old_median_s": old, "new_median_s": new, "ratio": new / old if old else float("inf")}
