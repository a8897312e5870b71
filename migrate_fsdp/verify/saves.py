"""What a training script saves, seen from inside the rank (torch.save, DCP, safetensors) and set aside after its run.

The probe wraps the three save functions before the script runs, so that
every checkpoint a version writes is named in its metrics (`save` records:
the kind and the absolute path). Both versions usually save to the same path
(they get the same arguments), so after a run that takes its turn the driver
moves what the old version saved into its run's directory, where the
comparison reads it (`checkpoints.py`) and the new run cannot overwrite it;
the new version's files stay where it wrote them.
"""

import functools
import os
import shutil
from pathlib import Path

TORCH, DCP, SAFETENSORS = "torch.save", "dcp.save", "safetensors"


def _path(target) -> str | None:
    if isinstance(target, (str, os.PathLike)):
        return os.path.abspath(os.fspath(target))
    name = getattr(target, "name", None)  # an open file
    return os.path.abspath(name) if isinstance(name, str) and os.path.isabs(name) else None


def install(writer) -> None:
    """Wrap the save functions; each call that names a path writes a `save` record."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.state_dict_saver as saver

    depth = [0]  # DCP writes its files with torch.save: only the outermost save is the script's

    def recorded(kind, function, where):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            depth[0] += 1
            try:
                result = function(*args, **kwargs)
            finally:
                depth[0] -= 1
            path = where(*args, **kwargs) if depth[0] == 0 else None
            if path is not None:
                writer.write("save", kind=kind, path=path)
            return result

        return wrapper

    torch.save = recorded(TORCH, torch.save, lambda obj, f, *a, **k: _path(f))

    def dcp_path(state_dict=None, *, checkpoint_id=None, storage_writer=None, **kwargs):
        return _path(checkpoint_id if checkpoint_id is not None else getattr(storage_writer, "path", None))

    dcp.save = saver.save = recorded(DCP, saver.save, dcp_path)
    try:
        import safetensors.torch as st
    except ImportError:
        return
    st.save_file = recorded(SAFETENSORS, st.save_file, lambda tensors, filename, *a, **k: _path(filename))


def saved_paths(run) -> list:
    """(kind, path) of everything the run saved, each path once, in the order first saved."""
    seen = {}
    for rank in run.ranks:
        for record in rank.saves:
            seen.setdefault(record["path"], record["kind"])
    return [(kind, path) for path, kind in seen.items()]


def set_aside(run) -> dict:
    """Move the run's saved files and directories into its own directory; original path -> where it is now."""
    aside = {}
    for index, (_, path) in enumerate(saved_paths(run)):
        if not os.path.exists(path):
            continue
        target = Path(run.directory) / "saved" / f"{index}-{os.path.basename(path.rstrip(os.sep))}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
        aside[path] = target
    return aside


def put_back(aside: dict) -> None:
    """Undo set_aside: move each file or directory back to where the run saved it."""
    for path, target in aside.items():
        if os.path.lexists(path):
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        shutil.move(target, path)
