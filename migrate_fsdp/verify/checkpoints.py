"""The `checkpoints` check: what both versions saved, read through convert-ckpt's readers and compared by FQN.

FSDP1 saves its FULL_STATE_DICT form (`{"model": {fqn: tensor}, "optimizer":
FSDP.optim_state_dict(...)}` with torch.save), FSDP2 the same through
`get_model_state_dict`/`get_optimizer_state_dict`, or a DCP directory;
convert-ckpt reads every one of these (and safetensors) into model and
optimizer state keyed by FQN, so the two compare entry by entry whatever
form each version chose. Where the setting is exact every tensor must be
bit-identical; elsewhere a floating-point tensor may differ, as
|a - b| / |a| over the whole tensor, by FACTOR times the control run's gap
in the same tensor of the same file when the pair had a control run
(envelope.py), else by the relative bound the parameter norm has after the
last update (tolerance.norm_rtol). Files that hold no tensors
(the other ranks' files under rank0_only) compare equal when both are empty.
An old file that has no FQN view (FSDP1's LOCAL or SHARDED_STATE_DICT) is
not compared, and says so; a new file that cannot be read where the old one
could fails the check.
"""

from migrate_fsdp.verify import envelope, tolerance
from migrate_fsdp.verify.compare import Check
from migrate_fsdp.verify.saves import saved_paths

NAME = "checkpoints"
_LISTED = 3  # problems quoted in the summary


def _state(path: str):
    """{"model": ..., "optimizer": ...} of a saved checkpoint, or None when it holds no tensors."""
    from migrate_fsdp.convert_ckpt.detect import read_source
    from migrate_fsdp.convert_ckpt.structure import discover, has_tensor

    tree = read_source(path, allow_unsafe=False).tree
    if not has_tensor(tree):
        return None
    found = discover(tree, path)
    optimizer = dict(found.optimizer or {})
    if optimizer:
        # State is keyed by FQN, so a group's FQN list is a set: FSDP1 lists it in flat-parameter order.
        optimizer["param_groups"] = [{**group, "params": sorted(group["params"])} for group in optimizer["param_groups"]]
    return {"model": found.model or {}, "optimizer": optimizer, "extras": found.extras}


def _relative_gap(old, new) -> float:
    import torch

    a, b = (torch.from_numpy(ref.array().copy()).view(getattr(torch, ref.dtype.name)).double() for ref in (old, new))
    scale = torch.linalg.vector_norm(a).item()
    gap = torch.linalg.vector_norm(a - b).item()
    return gap / scale if scale else gap


def _compare_states(old: dict, new: dict, rtol, where: str) -> tuple[list, float, float]:
    """(problems, largest relative gap, largest share of its tolerance) between two states.

    rtol: None, bit for bit; a number for every floating-point tensor; or a function of the tensor's key.
    """
    from migrate_fsdp.convert_ckpt.flatten import flatten
    from migrate_fsdp.convert_ckpt.tensors import TensorRef
    from migrate_fsdp.convert_ckpt.verify import compare_trees

    if rtol is None:
        return compare_trees(old, new, where), 0.0, 0.0
    tolerance_of = rtol if callable(rtol) else lambda key: rtol
    want = {key: value for key, _, value in flatten(old)}
    got = {key: value for key, _, value in flatten(new)}
    exact_old = {k: v for k, v in want.items() if not (isinstance(v, TensorRef) and v.dtype.floating)}
    exact_new = {k: v for k, v in got.items() if not (isinstance(v, TensorRef) and v.dtype.floating)}
    problems = [p for p in compare_trees(exact_old, exact_new, where) if not p.endswith((": missing", ": unexpected"))]
    problems += [f"{where}: {key}: missing" for key in want if key not in got]
    problems += [f"{where}: {key}: unexpected" for key in got if key not in want]
    worst = share = 0.0
    for key, gap in _tensor_gaps(want, got).items():
        if gap is None:
            problems.append(f"{where}: {key}: not a tensor of the same dtype and shape")
            continue
        allowed = tolerance_of(key)
        worst, share = max(worst, gap), max(share, gap / allowed if allowed else float("inf") if gap else 0.0)
        if gap > allowed:
            problems.append(f"{where}: {key}: relative diff {gap:.3g} > {allowed:.3g}")
    return sorted(problems), worst, share


def _tensor_gaps(want: dict, got: dict) -> dict:
    """key -> |a - b| / |a| of each floating-point tensor of `want` that `got` has too (None: not comparable)."""
    from migrate_fsdp.convert_ckpt.tensors import TensorRef

    gaps = {}
    for key in sorted(want.keys() & got.keys()):
        a, b = want[key], got[key]
        if not (isinstance(a, TensorRef) and a.dtype.floating):
            continue
        comparable = isinstance(b, TensorRef) and (a.dtype, a.shape) == (b.dtype, b.shape)
        gaps[key] = _relative_gap(a, b) if comparable else None
    return gaps


def _control_files(control: tuple | None, count: int) -> list:
    """The control run's saved files, where they were set aside, when it saved as many as the old run."""
    if control is None:
        return [None] * count
    run, places = control
    saved = [str(places.get(path, path)) for _, path in saved_paths(run)]
    return saved if len(saved) == count else [None] * count


def _control_rtol(old: dict, control_path: str | None, numel: int):
    """Per tensor key: FACTOR x the control's relative gap to the old file in that tensor (at least the float64
    summation floor); None without a readable control file."""
    from migrate_fsdp.convert_ckpt.errors import ConvertError
    from migrate_fsdp.convert_ckpt.flatten import flatten

    if control_path is None:
        return None
    try:
        control = _state(control_path)
    except ConvertError:
        return None
    if control is None:
        return None
    want = {key: value for key, _, value in flatten(old)}
    got = {key: value for key, _, value in flatten(control)}
    gaps = _tensor_gaps(want, got)
    floor = envelope.norm_floor(numel)
    return lambda key: max(envelope.FACTOR * (gaps.get(key) or 0.0), floor)


def check_checkpoints(old_run, new_run, old_places: dict, setting, steps: int, control: tuple | None = None
                      ) -> Check | None:
    """Compare what the versions saved; None when neither saved anything.

    `control`: (the control run, where its files were set aside), for a long run that is not exact: each
    file's floating-point tensors may then differ by FACTOR x the control's largest relative gap in that file.
    """
    from migrate_fsdp.convert_ckpt.errors import ConvertError

    old_saved, new_saved = saved_paths(old_run), saved_paths(new_run)
    if not old_saved and not new_saved:
        return None
    if len(old_saved) != len(new_saved):
        return Check(NAME, False, f"old saved {len(old_saved)} checkpoint(s), new saved {len(new_saved)}")
    same_paths = [p for _, p in old_saved] == [p for _, p in new_saved]
    rtol = None  # bit for bit
    problems, unread, compared, worst, share = [], [], 0, 0.0, 0.0
    control_files = _control_files(control, len(old_saved))
    for (_, old_path), (_, new_path), control_path in zip(old_saved, new_saved, control_files):
        where = old_path if same_paths else f"{old_path} vs {new_path}"
        try:
            old = _state(str(old_places.get(old_path, old_path)))
        except ConvertError as exc:  # an FSDP1 form with no FQN view (LOCAL/SHARDED_STATE_DICT): nothing to hold to
            unread.append(f"{where} ({exc})")
            continue
        try:
            new = _state(new_path)
        except ConvertError as exc:  # the old version's file was readable: the new one's must be too
            problems.append(f"{where}: the new version's file cannot be read as the old one's could: {exc}")
            continue
        compared += 1
        if old is None or new is None:
            if old is not new:
                problems.append(f"{where}: {'old' if old is None else 'new'} holds no tensors, the other does")
            continue
        if not setting.exact:
            numel = sum(ref.numel for ref in old["model"].values() if hasattr(ref, "numel"))
            rtol = _control_rtol(old, control_path, numel) or tolerance.norm_rtol(setting, max(steps - 1, 0), numel)
        found, gap, file_share = _compare_states(old, new, rtol, where)
        problems += found
        worst, share = max(worst, gap), max(share, file_share)
    not_read = f"; not compared: {'; '.join(unread)}" if unread else ""
    if problems:
        listed = "; ".join(problems[:_LISTED]) + (f"; and {len(problems) - _LISTED} more" if len(problems) > _LISTED
                                                  else "")
        return Check(NAME, False, f"{len(problems)} difference(s): {listed}{not_read}")
    how = "bit-identical" if setting.exact else (f"within tolerance (largest relative diff {worst:.3g}; "
                                                 f"{share:.0%} of its tolerance at most)")
    return Check(NAME, True, f"{compared} saved file(s) compared by FQN, model and optimizer state {how}{not_read}")
