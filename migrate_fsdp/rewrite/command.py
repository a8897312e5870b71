"""`migrate-fsdp rewrite`: the command line of the codemod."""

import signal
import sys

import click

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130


def _codes(values: tuple[str, ...]) -> list[str]:
    return [code.strip().upper() for value in values for code in value.split(",") if code.strip()]


def _fail(message: str, code: int = EXIT_ERROR) -> None:
    click.echo(f"migrate-fsdp rewrite: error: {message}", err=True)
    sys.exit(code)


def _terminate(signum, frame):
    raise KeyboardInterrupt


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--diff", "diff_mode", is_flag=True, help="Print a unified diff (git apply accepts it); write nothing.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if a file would change or an FSDP1 use is left.")
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--select", multiple=True, metavar="CODES", help="Only these rule codes or prefixes (comma-separated).")
@click.option("--ignore", multiple=True, metavar="CODES", help="Skip these rule codes or prefixes (comma-separated).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files and directories matching GLOB (repeatable).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Worker processes [default: CPU count].")
@click.option("--no-todo", is_flag=True, help="Do not write `# TODO(migrate-fsdp)` comments into files.")
@click.option("--list-codes", is_flag=True, help="List every code with its summary and exit.")
def rewrite(paths, diff_mode, check, output_format, select, ignore, exclude, jobs, no_todo, list_codes):
    """Rewrite FSDP1 code under PATHS to FSDP2, in place.

    Every FSDP1 use that is not converted is reported as
    `path:line:col: CODE message` and marked with a TODO comment.

    Exit status: 0 nothing left to do; 1 FSDP1 uses left unconverted, or
    (with --check/--diff) files that would change; 2 usage or internal error.
    """
    from migrate_fsdp.rewrite import report
    from migrate_fsdp.rewrite.files import PathError
    from migrate_fsdp.rewrite.runner import default_jobs, run
    from migrate_fsdp.rewrite.selection import INTERNAL_ERROR, Selection, UnknownCode, all_codes

    if list_codes:
        for code, summary in all_codes().items():
            click.echo(f"{code}  {summary}")
        return
    if not paths:
        raise click.UsageError("give at least one PATH (a file or a directory)")
    try:
        selection = Selection.from_prefixes(_codes(select), _codes(ignore))
    except UnknownCode as error:
        raise click.UsageError(str(error)) from None

    mode = "diff" if diff_mode else "check" if check else "write"
    signal.signal(signal.SIGTERM, _terminate)  # as Ctrl-C: a file being written is left whole, its temporary removed
    try:
        result = run(
            list(paths),
            selection,
            exclude=list(exclude),
            jobs=jobs or default_jobs(),
            todo=not no_todo,
            write=mode == "write",
        )
    except (PathError, OSError) as error:
        _fail(str(error))
    except KeyboardInterrupt:
        _fail("interrupted; files already rewritten were each replaced whole", EXIT_INTERRUPTED)

    if output_format == "json":
        click.echo(report.as_json(result, mode))
    else:
        if mode == "diff":
            for changed in result.changed:
                sys.stdout.buffer.write(report.diff_of(changed).encode(changed.encoding))
            sys.stdout.flush()
        to_stderr = mode == "diff"
        for diagnostic in result.diagnostics:
            click.echo(str(diagnostic), err=to_stderr)
        click.echo(report.summary(result, mode), err=True)

    if any(d.code == INTERNAL_ERROR for d in result.diagnostics):
        sys.exit(EXIT_ERROR)
    if result.diagnostics or (mode != "write" and result.changed):
        sys.exit(EXIT_FINDINGS)
    sys.exit(EXIT_CLEAN)
