"""One comparison: run the old and the new version, then judge them (or say why it could not be done)."""

import dataclasses
from dataclasses import dataclass, field

from migrate_fsdp.verify import perturb
from migrate_fsdp.verify.checkpoints import check_checkpoints
from migrate_fsdp.verify.compare import Verdict, compare, setting_of
from migrate_fsdp.verify.envelope import control_perturbation
from migrate_fsdp.verify.faults import RunFailure, run_failures
from migrate_fsdp.verify.launcher import run_sides
from migrate_fsdp.verify.saves import put_back, saved_paths, set_aside

EXIT_PASS, EXIT_PARITY, EXIT_NOT_RUN = 0, 1, 2


@dataclass
class Outcome:
    name: str  # the fixture's name, or the old script's path
    launch: object
    placement: object
    runs: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    verdict: Verdict | None = None

    @property
    def status(self) -> str:
        if self.failures or self.verdict is None:
            return "error"
        return "pass" if self.verdict.passed else "fail"

    @property
    def exit_code(self) -> int:
        return {"pass": EXIT_PASS, "fail": EXIT_PARITY, "error": EXIT_NOT_RUN}[self.status]


def not_run(name: str, launch, placement, side: str, message: str) -> Outcome:
    """An outcome for a pair that failed before anything ran (e.g. the rewrite refused)."""
    return Outcome(name, launch, placement, failures=[RunFailure(side, message)])


def run_pair(name: str, old, new, launch, placement, workdir) -> Outcome:
    if placement.concurrent:
        runs, old_places = run_sides([old, new], launch, placement, workdir), None
    else:
        # The old version's checkpoints go aside before the new one runs: both usually save to the same paths.
        [old_run] = run_sides([old], launch, placement, workdir)
        old_places = set_aside(old_run)
        runs = [old_run, *run_sides([new], launch, placement, workdir)]
    outcome = Outcome(name, launch, placement, runs)
    outcome.failures = [f for run in runs for f in run_failures(run, launch.steps, launch.timeout)]
    if outcome.failures:
        return outcome
    control, control_places = _control(old, runs, launch, placement, workdir)
    if control is not None:
        outcome.runs.append(control)
        outcome.failures = run_failures(control, launch.steps, launch.timeout)
        if outcome.failures:
            return outcome
    outcome.verdict = compare(runs[0], runs[1], launch.steps, control)
    _add_checkpoints(outcome.verdict, runs[:2], old_places, control and (control, control_places))
    return outcome


def _control(old, runs: list, launch, placement, workdir) -> tuple:
    """(the old version run once more with rounding-sized noise (envelope.py), where its saved files went),
    or (None, None) when the pair needs no control."""
    setting, steps = setting_of(runs[0], runs[1], launch.steps)
    spec = control_perturbation(setting, runs[0].ranks[0].steps, steps)
    if spec is None:
        return None, None
    side = dataclasses.replace(old, name="control", env={**old.env, perturb.ENV: spec})
    # The control saves where the new version did: its files go aside, and the new version's come back.
    new_places = set_aside(runs[1])
    try:
        [control] = run_sides([side], launch, placement, workdir)
        control_places = set_aside(control)
    finally:
        put_back(new_places)
    return control, control_places


def _add_checkpoints(verdict: Verdict, runs: list, old_places: dict | None, control: tuple | None) -> None:
    old_run, new_run = runs
    if old_places is None:
        if saved_paths(old_run) or saved_paths(new_run):
            verdict.notes.append("checkpoints not compared: the versions ran at the same time, so files saved to "
                                 "the same path would clash")
        return
    steps = min(len(rank.steps) for rank in old_run.ranks)
    check = check_checkpoints(old_run, new_run, old_places, verdict.setting, steps, control)
    if check is not None:
        verdict.checks.append(check)


def overall_exit(outcomes: list) -> int:
    return max((o.exit_code for o in outcomes), default=EXIT_PASS)
