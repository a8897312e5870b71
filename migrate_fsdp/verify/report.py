"""The JSON report (`--report`): everything the table shows, for every rank, for machines to read.

Schema version 1; docs/verify.md describes every field.
"""

import dataclasses
import json
from pathlib import Path

from migrate_fsdp.verify.atomic import atomic_path

SCHEMA_VERSION = 1


def _run(run) -> dict:
    return {
        "script": run.side.shown,
        "path": str(run.side.script),
        "args": run.side.args,
        "wall_s": run.wall_s,
        "returncode": run.returncode,
        "timed_out": run.timed_out,
        "ranks": [{"rank": r.rank, "status": r.status, "steps": len(r.steps)} for r in run.ranks],
        "optimizers": [{"optimizer": setup["optimizer"], "units": setup["units"]}
                       for setup in next((r.setups for r in run.ranks if r.setups), [])],
    }


def _setting(setting) -> dict:
    return {
        "label": setting.label(),
        "exact": setting.exact,
        "world_size": setting.world_size,
        "device": setting.device,
        "eps": {"reduction_order": setting.reduction_order, "accumulation": setting.accumulation,
                "clipping": setting.clipping},
        "notes": setting.notes,
    }


def outcome_dict(outcome) -> dict:
    out = {
        "name": outcome.name,
        "status": outcome.status,
        "exit_code": outcome.exit_code,
        "nproc": outcome.launch.nproc,
        "steps": outcome.launch.steps,
        "placement": outcome.placement.describe(),
        "concurrent": outcome.placement.concurrent,
        "runs": {run.side.name: _run(run) for run in outcome.runs},
        "failures": [dataclasses.asdict(f) for f in outcome.failures],
    }
    verdict = outcome.verdict
    if verdict is not None:
        out.update(
            setting=_setting(verdict.setting),
            checks=[dataclasses.asdict(c) for c in verdict.checks],
            per_step=verdict.steps,
            memory=verdict.memory,
            speed=verdict.speed,
            warnings=verdict.warnings,
            notes=verdict.notes,
        )
    return out


def write_report(path: Path, outcomes: list, exit_code: int, wall_s: float) -> None:
    document = {
        "schema": SCHEMA_VERSION,
        "tool": "migrate-fsdp verify",
        "exit_code": exit_code,
        "passed": exit_code == 0,
        "wall_s": wall_s,
        "pairs": [outcome_dict(o) for o in outcomes],
    }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
