"""The bundled fixture suite: each fixtures/train/<name>/ compared as its own pair.

A fixture is a directory with `fsdp1.py` (real-world FSDP1 code), usually
`fsdp2.py` (its hand-written FSDP2 version) and optionally `fixture.json`:
  {"args": [...]}                     arguments for both scripts;
  {"kind": "resume", "save": [...], "convert": [...], "old": [...], "new": [...]}
                                      run `save` under torchrun, then
                                      `migrate-fsdp convert-ckpt <convert>`, then
                                      compare `old` with `new`; "{workdir}" in
                                      any of them is a fresh scratch directory.
By default the new side is our own rewrite of fsdp1.py; `--hand-written`
uses fsdp2.py instead. A resume fixture always runs the commands it names.
Fixture scripts are short: unless --steps says otherwise, each trains to its
own end and every step is compared.
"""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from migrate_fsdp.fixtures import fixtures_dir
from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.faults import RunFailure, run_failures
from migrate_fsdp.verify.launcher import Side, run_sides
from migrate_fsdp.verify.pair import Outcome, not_run, run_pair
from migrate_fsdp.verify.rewrite_side import rewritten_side
from migrate_fsdp.verify.timeouts import UNWATCHED_S


@dataclass
class Fixture:
    name: str
    directory: Path
    spec: dict

    @property
    def kind(self) -> str:
        return self.spec.get("kind", "pair")

    def shown(self, filename: str) -> str:
        return f"{self.directory.parent.name}/{self.name}/{filename}"


def discover(root: Path | None = None) -> list:
    root = root or fixtures_dir() / "train"
    fixtures = []
    for directory in sorted(p for p in root.iterdir() if (p / "fsdp1.py").is_file()):
        spec_file = directory / "fixture.json"
        try:
            spec = json.loads(spec_file.read_text(encoding="utf-8")) if spec_file.exists() else {}
        except json.JSONDecodeError as exc:
            raise VerifyError(f"{spec_file}: not valid JSON ({exc})") from exc
        fixtures.append(Fixture(directory.name, directory, spec))
    return fixtures


def select(fixtures: list, names: tuple) -> list:
    if not names:
        return fixtures
    known = {f.name: f for f in fixtures}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise VerifyError(f"no fixture named {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return [known[n] for n in names]


def run_fixture(fixture: Fixture, launch, placement, workdir: Path, hand_written: bool) -> Outcome:
    workdir.mkdir(parents=True, exist_ok=True)
    if fixture.kind == "resume":
        return _run_resume(fixture, launch, placement, workdir)
    args = list(fixture.spec.get("args", []))
    old = Side("old", fixture.directory / "fsdp1.py", args, shown=fixture.shown("fsdp1.py"))
    if hand_written:
        if not (fixture.directory / "fsdp2.py").is_file():
            return not_run(fixture.name, launch, placement, "new", f"{fixture.shown('fsdp2.py')} does not exist")
        new = Side("new", fixture.directory / "fsdp2.py", args, shown=fixture.shown("fsdp2.py"))
    else:
        try:
            new = rewritten_side(old.script, fixture.directory, args, workdir)
        except VerifyError as exc:
            return not_run(fixture.name, launch, placement, "new", str(exc))
        new.shown = f"rewrite of {old.shown}"
    return run_pair(fixture.name, old, new, launch, placement, workdir)


def _run_resume(fixture: Fixture, launch, placement, workdir: Path) -> Outcome:
    scratch = workdir / "scratch"
    scratch.mkdir(exist_ok=True)

    def command(key: str) -> list:
        try:
            return [item.replace("{workdir}", str(scratch)) for item in fixture.spec[key]]
        except KeyError:
            raise VerifyError(f"{fixture.directory / 'fixture.json'}: a resume fixture needs \"{key}\"") from None

    save, convert, old, new = (command(key) for key in ("save", "convert", "old", "new"))
    saving = Side("save", fixture.directory / save[0], save[1:], shown=fixture.shown(save[0]), watched=False)
    [saved] = run_sides([saving], launch, placement, workdir)
    failures = run_failures(saved, launch.steps, launch.timeout)
    if failures:
        return Outcome(fixture.name, launch, placement, [saved], failures)
    try:
        converted = subprocess.run(
            [sys.executable, "-m", "migrate_fsdp", "convert-ckpt", *convert],
            capture_output=True, text=True, timeout=launch.timeout or UNWATCHED_S, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return not_run(fixture.name, launch, placement, "convert",
                       f"migrate-fsdp convert-ckpt still running after {launch.timeout or UNWATCHED_S:g}s")
    if converted.returncode != 0:
        tail = "\n".join((converted.stdout + converted.stderr).strip().splitlines()[-15:])
        return Outcome(fixture.name, launch, placement, [saved], [RunFailure(
            "convert", f"migrate-fsdp convert-ckpt {' '.join(convert)} failed (exit {converted.returncode})", tail)])
    old_side = Side("old", fixture.directory / old[0], old[1:], shown=fixture.shown(old[0]))
    new_side = Side("new", fixture.directory / new[0], new[1:], shown=fixture.shown(new[0]))
    return run_pair(fixture.name, old_side, new_side, launch, placement, workdir)
