"""How a run is shown: ruff-style lines and a summary, or one JSON document."""

import json
from collections import Counter

from migrate_fsdp.rewrite.diff import unified_diff
from migrate_fsdp.rewrite.rules import RULES
from migrate_fsdp.rewrite.runner import RunResult

_HEADS_UP = frozenset(rule.code for rule in RULES if rule.heads_up)


def diff_of(result) -> str:
    return unified_diff(result.path, result.source.decode(result.encoding), result.code)


def summary(run: RunResult, mode: str) -> str:
    changed = len(run.changed)
    verb = {"write": "Rewrote", "check": "Would rewrite", "diff": "Would rewrite"}[mode]
    parts = [f"{verb} {changed} file{'s' * (changed != 1)} ({run.scanned} scanned)"]
    left = [d for d in run.diagnostics if d.code not in _HEADS_UP]
    heads_up = [d for d in run.diagnostics if d.code in _HEADS_UP]
    if left:
        parts.append(f"{len(left)} FSDP1 use{'s' * (len(left) != 1)} not converted ({_by_code(left)})")
    else:
        parts.append("nothing left unconverted")
    if heads_up:
        parts.append(f"{len(heads_up)} heads-up{'s' * (len(heads_up) != 1)} on converted code ({_by_code(heads_up)})")
    return "; ".join(parts) + "."


def _by_code(diagnostics) -> str:
    counts = Counter(d.code for d in diagnostics)
    return ", ".join(f"{code}: {n}" for code, n in sorted(counts.items()))


def as_json(run: RunResult, mode: str) -> str:
    files = []
    for result in run.results:
        entry = {"path": result.path, "changed": result.changed}
        if mode == "diff" and result.changed:
            entry["diff"] = diff_of(result)
        files.append(entry)
    diagnostics = run.diagnostics
    document = {
        "mode": mode,
        "files": files,
        "diagnostics": [d.to_json() for d in diagnostics],
        "summary": {
            "scanned": run.scanned,
            "parsed": len(run.results),
            "changed": len(run.changed),
            "diagnostics": len(diagnostics),
            "by_code": dict(sorted(Counter(d.code for d in diagnostics).items())),
        },
    }
    return json.dumps(document, indent=2)
