"""The conversion from start to end: read, find, rename, check, cast, write beside DST, verify, rename into place."""

import os
import sys
import time
from dataclasses import dataclass, field

from migrate_fsdp.convert_ckpt.atomic import atomic_destination, check_destination
from migrate_fsdp.convert_ckpt.detect import read_source
from migrate_fsdp.convert_ckpt.dtypes import CAST_TARGETS
from migrate_fsdp.convert_ckpt.errors import ConvertError, Mismatch
from migrate_fsdp.convert_ckpt.fileio import OutputFile, close_sources
from migrate_fsdp.convert_ckpt.flatten import flatten
from migrate_fsdp.convert_ckpt.keys import Renamer, parse_rename, rename_keys, rename_optimizer
from migrate_fsdp.convert_ckpt.layout import DCP, TORCH, Output, Plan, plan_outputs, sharded_tensor_ids
from migrate_fsdp.convert_ckpt.progress import Progress, human_bytes
from migrate_fsdp.convert_ckpt.snippet import loading_snippet
from migrate_fsdp.convert_ckpt.structure import discover
from migrate_fsdp.convert_ckpt.tensors import TensorRef


@dataclass
class Options:
    src: str
    dst: str
    to: str = DCP
    layout: str = "keep"
    only_model: bool = False
    model_key: str | None = None
    optim_key: str | None = None
    keep_prefixes: bool = False
    renames: list[str] = field(default_factory=list)
    check_against: str | None = None
    dtype: str | None = None
    shards: int = 1
    max_shard_size: int = 5 * 10**9
    verify: bool = False
    force: bool = False
    unsafe_pickle: bool = False
    progress: bool = False
    quiet: bool = False


def _validate(options: Options) -> None:
    if options.shards < 1:
        raise ConvertError("--shards must be at least 1")
    if options.shards > 1 and options.to != DCP:
        raise ConvertError("--shards pre-splits a DCP checkpoint; it needs --to dcp")
    src, dst = os.path.realpath(options.src), os.path.realpath(options.dst)
    if src == dst:
        raise ConvertError("DST is SRC; write the conversion somewhere else")
    if src.startswith(os.path.join(dst, "")):  # replacing DST (--force) would delete SRC, and whatever else is there
        raise ConvertError(f"DST {options.dst} is a directory holding SRC; write the conversion somewhere else")
    check_destination(options.dst, options.force)


def _tensors(tree) -> list[TensorRef]:
    return [value for _, _, value in flatten(tree) if isinstance(value, TensorRef)] if isinstance(tree, dict) else []


def _write(output: Output, path: str, plan: Plan, options: Options, source, sharded: set[int], progress) -> None:
    if output.kind == DCP:
        os.makedirs(path, exist_ok=True)
        from migrate_fsdp.convert_ckpt.write_dcp import write_dcp

        final = os.path.join(os.path.abspath(options.dst), output.name) if output.name else os.path.abspath(options.dst)
        write_dcp(output.tree, path, final, progress, options.shards, lambda tensor: id(tensor) in sharded)
    elif output.kind == TORCH:
        from migrate_fsdp.convert_ckpt.write_torch import write_archive

        with OutputFile(path, progress) as out:
            write_archive(out, output.tree)
    else:
        from migrate_fsdp.convert_ckpt.write_safetensors import check_tensors, write_file, write_sharded

        check_tensors(output.tree)
        if plan.dst_is_dir and not output.name:
            write_sharded(path, output.tree, source.safetensors_metadata, options.max_shard_size, progress)
        else:
            write_file(path, output.tree, source.safetensors_metadata, progress)


def _verify(plan: Plan, root: str, options: Options, err) -> None:
    from migrate_fsdp.convert_ckpt.verify import compare_trees

    problems = []
    for output in plan.outputs:
        path = os.path.join(root, output.name) if output.name else root
        written = read_source(path, options.unsafe_pickle).tree
        problems += compare_trees(output.tree, written, output.name or os.path.basename(options.dst))
    for problem in problems:
        err.write(f"mismatch: {problem}\n")
    if problems:
        raise Mismatch(f"--verify found {len(problems)} mismatch(es); {options.dst} was not written")


def _plan(options: Options, err):
    """Read SRC and decide what to write: (source, plan, ids of the tensors FSDP2 shards)."""
    renamer = Renamer(not options.keep_prefixes, [parse_rename(spec) for spec in options.renames])
    source = read_source(options.src, options.unsafe_pickle)
    checkpoint = discover(source.tree, options.src, options.model_key, options.optim_key)
    model = rename_keys(checkpoint.model, renamer, "model") if checkpoint.model is not None else None
    optimizer = rename_optimizer(checkpoint.optimizer, renamer) if checkpoint.optimizer is not None else None
    if options.check_against:
        from migrate_fsdp.convert_ckpt.check_against import check_against

        problems = check_against(options.check_against, model, optimizer)
        for problem in problems:
            err.write(f"{problem}\n")
        if problems:
            raise Mismatch(f"{len(problems)} problem(s) against {options.check_against}; nothing was written")
    if options.dtype and model is not None:
        from migrate_fsdp.convert_ckpt.cast import cast_model

        model = cast_model(model, CAST_TARGETS[options.dtype])
    plan = plan_outputs(checkpoint, model, optimizer, options.to, options.layout, options.only_model, options.dst)
    if checkpoint.model is None and checkpoint.optimizer is None and not options.quiet:
        err.write(
            "note: no model or optimizer state found; converting the structure as it is (keys not renamed, "
            "no loading snippet); name them with --model-key / --optim-key\n"
        )
    return source, plan, sharded_tensor_ids(model, optimizer) if options.shards > 1 else set()


def convert(options: Options, out=None, err=None) -> None:
    out, err = out or sys.stdout, err or sys.stderr
    _validate(options)
    started = time.monotonic()
    try:
        source, plan, sharded = _plan(options, err)
        tensors = [t for output in plan.outputs for t in _tensors(output.tree)]
        total = sum(t.nbytes for t in tensors)
        progress = Progress(total, options.progress and not options.quiet)
        with atomic_destination(options.dst, plan.dst_is_dir, options.force, err) as root:
            for output in plan.outputs:
                path = os.path.join(root, output.name) if output.name else root
                _write(output, path, plan, options, source, sharded, progress)
            progress.close()
            seconds = time.monotonic() - started
            if options.verify:
                _verify(plan, root, options, err)
    finally:
        close_sources()
    if options.quiet:
        return
    kinds = "+".join(dict.fromkeys(o.kind for o in plan.outputs))
    out.write(
        f"converted {options.src} ({source.kind}) -> {options.dst} ({kinds}, layout {options.layout}): "
        f"{len(tensors)} tensors, {human_bytes(total)} in {seconds:.2f} s ({human_bytes(total / max(seconds, 1e-9))}/s)"
        + (", verified bit-exact" if options.verify else "")
        + "\n"
    )
    snippet = loading_snippet(plan, options.dst, options.layout == "torchtitan")
    if snippet:
        out.write("\n" + snippet + "\n")
