"""How a run is shown: ruff-style lines and a summary, or one JSON document."""

import json
from collections import Counter

from migrate_fsdp.rewrite.diff import unified_diff
from migrate_fsdp.rewrite.runner import RunResult


def diff_of(result) -> str:
    return unified_diff(result.path, result.source.decode(result.encoding), result.code)


def summary(run: RunResult, mode: str) -> str:
    changed = len(run.changed)
    verb = {"write": "Rewrote", "check": "Would rewrite", "diff": "Would rewrite"}[mode]
    parts = [f"{verb} {changed} file{'s' * (changed != 1)} ({run.scanned} scanned)"]
    diagnostics = run.diagnostics
    if diagnostics:
        counts = Counter(d.code for d in diagnostics)
        detail = ", ".join(f"{code}: {n}" for code, n in sorted(counts.items()))
        parts.append(f"{len(diagnostics)} FSDP1 use{'s' * (len(diagnostics) != 1)} not converted ({detail})")
    else:
        parts.append("nothing left unconverted")
    return "; ".join(parts) + "."


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
