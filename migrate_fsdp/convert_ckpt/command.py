"""The `migrate-fsdp convert-ckpt` command line.

Imports only click and the standard library: the conversion modules are
imported when the command runs, so `migrate-fsdp --help` stays instant.
Exit codes: 0 done, 1 `--verify` mismatches or `--check-against` problems,
2 bad input, refused input, usage or internal error, 130 interrupted. Errors
are one line on stderr, never a traceback (set MIGRATE_FSDP_DEBUG=1 for one).
"""

import os
import re
import signal
import sys

import click

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)\s*$", re.IGNORECASE)


def _parse_size(ctx, param, value):
    if value is None:
        return None
    match = _SIZE.match(value)
    if not match:
        raise click.BadParameter(f"{value!r} is not a size like 5GB or 500MB")
    number, prefix, suffix = match.groups()
    base = 1024 if suffix.upper().startswith("I") else 1000
    return int(float(number) * base ** " KMGT".index(prefix.upper() or " "))


def _terminate(signum, frame):
    raise KeyboardInterrupt


@click.command(
    "convert-ckpt",
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 done, 1 --verify mismatch or --check-against problems, 2 bad input or error, "
    "130 interrupted.",
)
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path())
@click.option(
    "--to",
    "to",
    type=click.Choice(["dcp", "safetensors", "torch"]),
    default="dcp",
    show_default=True,
    help="Output format: a DCP directory, safetensors (a .safetensors file, or a directory of shards with an "
    "index), or one torch.save file.",
)
@click.option(
    "--layout",
    type=click.Choice(["keep", "torchtitan", "accelerate"]),
    default="keep",
    show_default=True,
    help="keep: the input's nesting; torchtitan: model keys at the top, optimizer flattened under "
    "'optimizer'; accelerate: the files Accelerator.save_state writes for FSDP.",
)
@click.option("--only", type=click.Choice(["model"]), default=None, help="Write only the model state dict.")
@click.option("--model-key", metavar="KEY", help="Dotted path of the model state dict in an unusual file (a.b).")
@click.option("--optim-key", metavar="KEY", help="Dotted path of the optimizer state in an unusual file.")
@click.option(
    "--keep-prefixes",
    is_flag=True,
    help="Keep module./_orig_mod./_fsdp_wrapped_module./_checkpoint_wrapped_module. in parameter names.",
)
@click.option(
    "--rename",
    "renames",
    multiple=True,
    metavar="REGEX=REPL",
    help="Rename parameter FQNs (model and optimizer) with re.sub; repeatable, applied in order.",
)
@click.option(
    "--check-against",
    metavar="MODULE:FACTORY",
    help="Build the model with FACTORY() on the meta device and list every missing, unexpected or "
    "mis-shaped key before writing anything (MODULE may be path/to/file.py).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    help="Cast floating-point model tensors; optimizer state keeps its precision.",
)
@click.option(
    "--shards",
    type=int,
    default=1,
    show_default=True,
    metavar="N",
    help="Pre-split model and optimizer tensors along dim 0 as FSDP2 shards them over N ranks, so each "
    "rank reads about 1/N of the bytes (DCP only).",
)
@click.option(
    "--max-shard-size",
    callback=_parse_size,
    default="5GB",
    show_default=True,
    metavar="SIZE",
    help="Largest safetensors shard when DST is a directory.",
)
@click.option("--verify", is_flag=True, help="Re-read the result and check every tensor bit-exact against the source.")
@click.option("--force", is_flag=True, help="Replace an existing DST.")
@click.option(
    "--unsafe-pickle",
    is_flag=True,
    help="Unpickle globals outside the allow-list. This runs code from the file: only for files you trust.",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when it is a terminal).")
@click.option("-q", "--quiet", is_flag=True, help="No summary and no loading snippet.")
def convert_ckpt(
    src,
    dst,
    to,
    layout,
    only,
    model_key,
    optim_key,
    keep_prefixes,
    renames,
    check_against,
    dtype,
    shards,
    max_shard_size,
    verify,
    force,
    unsafe_pickle,
    progress,
    quiet,
):
    """Convert an FSDP1 FULL_STATE_DICT checkpoint (torch.save, safetensors) to DCP for FSDP2, or back.

    SRC is detected by content: a torch.save file, a .safetensors file or a Hugging Face sharded directory
    (*.safetensors.index.json), or a DCP directory. The model state dict, the optimizer state (keyed by
    parameter FQN, as FSDP.optim_state_dict gives it) and the extras (epoch, step, scheduler, RNG...) are
    carried over; tensors are streamed, never all held in memory, and DST appears only when complete.
    """
    from migrate_fsdp.convert_ckpt.convert import Options, convert
    from migrate_fsdp.convert_ckpt.errors import ConvertError

    if unsafe_pickle:
        click.echo(
            "migrate-fsdp convert-ckpt: warning: --unsafe-pickle runs any code the checkpoint's pickle names; "
            "use it only on files you trust",
            err=True,
        )
    options = Options(
        src=src,
        dst=dst,
        to=to,
        layout=layout,
        only_model=only == "model",
        model_key=model_key,
        optim_key=optim_key,
        keep_prefixes=keep_prefixes,
        renames=list(renames),
        check_against=check_against,
        dtype=dtype,
        shards=shards,
        max_shard_size=max_shard_size,
        verify=verify,
        force=force,
        unsafe_pickle=unsafe_pickle,
        progress=sys.stderr.isatty() if progress is None else progress,
        quiet=quiet,
    )
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        convert(options)
    except ConvertError as error:
        _fail(str(error), error.exit_code)
    except KeyboardInterrupt:
        _fail(f"interrupted; {dst} was not written", 130)
    except OSError as error:  # disk full, permission denied...: the input or the machine, not a bug
        _fail(f"{error.filename or ''}: {error.strerror or error}" if error.filename else str(error), 2)
    except Exception as error:  # an internal error is still one line; MIGRATE_FSDP_DEBUG=1 shows the traceback
        if os.environ.get("MIGRATE_FSDP_DEBUG"):
            raise
        _fail(f"internal error: {type(error).__name__}: {error}", 2)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fail(message: str, code: int):
    click.echo(f"migrate-fsdp convert-ckpt: error: {' '.join(message.split())}", err=True)
    sys.exit(code)
