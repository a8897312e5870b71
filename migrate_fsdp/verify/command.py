"""The `verify` click command: parse, validate, dispatch; all heavy imports happen inside."""

import signal
import sys
import time
from pathlib import Path

import click

_RENDEZVOUS = ("--nnodes", "--node-rank", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
               "--master-addr", "--master-port")


def _rendezvous_options(function):
    for flag in reversed(_RENDEZVOUS):
        function = click.option(flag, metavar="VALUE", help=f"Passed to torchrun as {flag}.")(function)
    return function


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED, metavar="[OLD.py] [-- SCRIPT_ARGS...]")
@click.option("--new", "new_script", type=click.Path(path_type=Path), metavar="NEW.py|DIR",
              help="The FSDP2 version to compare OLD.py with: a script, or the FSDP2 copy of OLD.py's project. "
                   "Default: our own rewrite of the project.")
@click.option("--project", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="The project OLD.py belongs to (what the rewrite converts, what --new DIR mirrors). "
                   "Default: OLD.py's package root.")
@click.option("--nproc", type=click.IntRange(min=1), default=2, show_default=True,
              help="Ranks per run (torchrun --nproc-per-node).")
@click.option("--steps", type=click.IntRange(min=1),
              help="Stop both runs after at most this many optimizer steps. Default: both train to their end "
                   "and every step is compared.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: GPUs when there are --nproc of them, else CPU with gloo.")
@click.option("--timeout", type=click.FloatRange(min=1),
              help="Seconds one run may take; a run still going is killed with all its processes. Default: a run "
                   "is hung when it makes no progress for 10 x its slowest step so far (at least 60 s; 300 s to "
                   "start).")
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path), help="Write a JSON report here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG of the loss curves and memory peaks here (needs matplotlib).")
@click.option("--fixture", "fixtures", multiple=True, metavar="NAME",
              help="Fixture suite only: run just this fixture (repeatable).")
@click.option("--hand-written", is_flag=True,
              help="Fixture suite only: compare with the fixtures' own fsdp2.py instead of our rewrite.")
@click.option("--logs", type=click.Path(file_okay=False, path_type=Path),
              help="Keep every rank's stdout, stderr and metrics in this directory.")
@_rendezvous_options
def verify(argv, new_script, project, nproc, steps, device, timeout, report, plot, fixtures, hand_written, logs,
           **rdzv):
    """Train the FSDP1 and the FSDP2 version side by side under torchrun and check that they agree.

    \b
    migrate-fsdp verify                      the bundled fixture suite
    migrate-fsdp verify OLD.py [-- ARGS]     OLD.py against our rewrite of its project
    migrate-fsdp verify OLD.py --new NEW.py|DIR [-- ARGS]

    Compares, step by step, the loss, the global gradient and parameter norms
    (bit for bit where the setting allows) and the set of sharded modules, and
    reports the peak memory and step time of both. Exit status: 0 all checks
    pass, 1 a parity check fails, 2 a run could not be done.
    """
    from migrate_fsdp.verify.errors import VerifyError

    # SIGTERM (a CI job's timeout, kill) then unwinds like Ctrl-C, through the launcher's cleanup of the runs.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        code = _verify(argv, new_script, project, nproc, steps, device, timeout, report, plot, fixtures, hand_written,
                       logs, rdzv)
    except VerifyError as exc:
        click.echo(f"migrate-fsdp verify: error: {exc}", err=True)
        code = 2
    except KeyboardInterrupt:
        click.echo("migrate-fsdp verify: error: interrupted; the runs it had started were ended", err=True)
        code = 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    sys.exit(code)


def _verify(argv, new_script, project, nproc, steps, device, timeout, report, plot, fixtures, hand_written, logs,
            rdzv):
    import tempfile

    from migrate_fsdp.verify.errors import VerifyError
    from migrate_fsdp.verify.launcher import Launch
    from migrate_fsdp.verify.placement import plan, visible_gpus
    from migrate_fsdp.verify.progress import LiveLine
    from migrate_fsdp.verify.project import project_root

    # Click keeps no trace of `--`: a first argument that looks like a flag was meant for the script.
    old_script, script_args = (Path(argv[0]), list(argv[1:])) if argv and not argv[0].startswith("-") else (None, argv)
    if old_script is None and (new_script or project or script_args):
        raise VerifyError("--new, --project and script arguments need OLD.py")
    if old_script is not None and (fixtures or hand_written):
        raise VerifyError("--fixture and --hand-written apply to the fixture suite (no OLD.py)")
    if old_script is not None and not old_script.is_file():
        raise VerifyError(f"{old_script}: {'not a file' if old_script.exists() else 'no such file'}")
    root = project_root(old_script, project) if old_script is not None else None
    if new_script is not None:
        new_script = _new_version(old_script, root, new_script)
    for path in (report, plot, logs):
        if path is not None and not path.resolve().parent.is_dir():
            raise VerifyError(f"{path}: its directory does not exist")
    _check_writable(report, plot, logs)
    if plot is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise VerifyError("--plot needs matplotlib: pip install 'migrate-fsdp[plot]'")
    launch = Launch(nproc=nproc, steps=steps, timeout=timeout,
                    rendezvous=[[flag, rdzv[flag[2:].replace("-", "_")]] for flag in _RENDEZVOUS
                                if rdzv[flag[2:].replace("-", "_")] is not None])
    placement = plan(device, nproc, visible_gpus() if device != "cpu" else [], launch.standalone)
    launch.progress = LiveLine.for_terminal(steps)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="migrate-fsdp-verify-") as scratch:
        workdir = Path(logs) if logs else Path(scratch)
        if old_script is None:
            outcomes = _suite(launch, placement, workdir, fixtures, hand_written)
        else:
            outcomes = [_single(old_script, root, new_script, script_args, launch, placement, workdir)]
    return _finish(outcomes, report, plot, time.monotonic() - started, suite=old_script is None)


def _check_writable(report, plot, logs):
    from migrate_fsdp.verify.atomic import check_writable
    from migrate_fsdp.verify.errors import VerifyError

    places = [(path, path.resolve().parent) for path in (report, plot) if path is not None]
    for path, directory in ([(logs, logs)] if logs is not None else []) + places:
        try:
            directory.mkdir(exist_ok=True)
            check_writable(directory)
        except OSError as exc:
            raise VerifyError(f"{path}: cannot write there ({exc.strerror})") from exc


def _new_version(old_script, root, new):
    """The FSDP2 script: NEW.py itself, or OLD.py's place in the FSDP2 project DIR."""
    from migrate_fsdp.verify.errors import VerifyError
    from migrate_fsdp.verify.project import in_project

    if not new.exists():
        raise VerifyError(f"{new}: no such file or directory")
    if not new.is_dir():
        return new
    script = in_project(old_script, root, new)
    if not script.is_file():
        raise VerifyError(f"--new {new}: no {script.relative_to(new)} in it (OLD.py's place in its project {root}); "
                          "pass the FSDP2 copy of that directory, or --project")
    return script


def _single(old_script, root, new_script, script_args, launch, placement, workdir):
    from migrate_fsdp.verify.launcher import Side
    from migrate_fsdp.verify.pair import run_pair
    from migrate_fsdp.verify.rewrite_side import rewritten_side
    from migrate_fsdp.verify.table import render_pair

    old = Side("old", old_script.resolve(), script_args, shown=str(old_script))
    if new_script is not None:
        new = Side("new", new_script.resolve(), script_args, shown=str(new_script))
    else:
        new = rewritten_side(old.script, root, script_args, workdir)
    click.echo(f"verify: {old.shown} (old) vs {new.shown} (new) ...")
    outcome = run_pair(str(old_script), old, new, launch, placement, workdir)
    click.echo(render_pair(outcome))
    return outcome


def _suite(launch, placement, workdir, names, hand_written):
    from migrate_fsdp.verify import suite
    from migrate_fsdp.verify.table import render_pair

    fixtures = suite.select(suite.discover(), names)
    against = "their hand-written fsdp2.py" if hand_written else "our rewrite"
    click.echo(f"verify: {len(fixtures)} fixtures, fsdp1.py against {against}; {placement.describe()}")
    outcomes = []
    for fixture in fixtures:
        started = time.monotonic()
        outcome = suite.run_fixture(fixture, launch, placement, workdir / fixture.name, hand_written)
        outcomes.append(outcome)
        click.echo(f"  {fixture.name}: {outcome.status.upper()} ({time.monotonic() - started:.1f} s)")
    for outcome in outcomes:
        if outcome.status != "pass":
            click.echo("\n" + render_pair(outcome))
    return outcomes


def _finish(outcomes, report, plot, wall_s, suite):
    from migrate_fsdp.verify.pair import overall_exit
    from migrate_fsdp.verify.table import render_suite

    code = overall_exit(outcomes)
    if suite:
        click.echo("\n" + render_suite(outcomes, wall_s))
    not_run = [o for o in outcomes if o.status == "error"]
    if suite and not_run:
        names = ", ".join(o.name for o in not_run)
        click.echo(f"migrate-fsdp verify: error: {len(not_run)} of {len(outcomes)} fixtures could not be run: "
                   f"{names}", err=True)
    elif not_run:
        click.echo(f"migrate-fsdp verify: error: {not_run[0].failures[0].message}", err=True)
    if report is not None:
        from migrate_fsdp.verify.report import write_report

        _writing(report, lambda: write_report(report, outcomes, code, wall_s))
    if plot is not None and any(o.verdict is not None for o in outcomes):
        from migrate_fsdp.verify.plot import write_plot

        _writing(plot, lambda: write_plot(plot, outcomes))
    return code


def _writing(path, write) -> None:
    """Write an output file; a failure names the user's path, not the temporary file beside it."""
    from migrate_fsdp.verify.errors import VerifyError

    try:
        write()
    except OSError as exc:
        raise VerifyError(f"cannot write {path}: {exc.strerror}; the comparison ran, see above") from exc
