"""Finding the model state dict, the optimizer state and the extras in a checkpoint, and refusing what is not FULL.

Real checkpoints nest in a handful of ways: `{"model": ..., "optimizer": ...,
"epoch": ...}` and its synonyms, a bare model state dict, a bare optimizer
state dict (Accelerate's optimizer.bin), torchtitan's model-at-the-top with a
flattened optimizer. The optimizer is kept internally in the nested form
FSDP.optim_state_dict and get_optimizer_state_dict produce:
`{"state": {fqn: {...}}, "param_groups": [{..., "params": [fqn, ...]}]}`.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused
from migrate_fsdp.convert_ckpt.tensors import TensorRef

MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module")
OPTIM_KEYS = ("optimizer", "optim", "optimizer_state_dict", "optim_state_dict")
STATE, PARAM_GROUPS, PARAMS = "state", "param_groups", "params"


@dataclass
class Checkpoint:
    root: object
    model: dict | None = None
    model_path: tuple | None = None  # () when the model entries sit at the top level (bare or torchtitan)
    optimizer: dict | None = None
    optim_path: tuple | None = None
    optim_flat: bool = False  # the input stored it flattened (torchtitan)
    extras: dict = field(default_factory=dict)


def dotted(key: str) -> tuple:
    return tuple(key.split("."))


def get_path(tree, path: tuple):
    for part in path:
        if not isinstance(tree, Mapping) or part not in tree:
            return None
        tree = tree[part]
    return tree


def is_nested_optim(value) -> bool:
    return (
        isinstance(value, Mapping)
        and isinstance(value.get(STATE), Mapping)
        and isinstance(value.get(PARAM_GROUPS), list)
    )


def is_flat_optim(value) -> bool:
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(k, str) and k.startswith((STATE + ".", PARAM_GROUPS + ".")) for k in value)
    )


def has_tensor(value) -> bool:
    if isinstance(value, TensorRef):
        return True
    if isinstance(value, Mapping):
        return any(has_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_tensor(v) for v in value)
    return False


def discover(tree, what: str, model_key: str | None = None, optim_key: str | None = None) -> Checkpoint:
    if not isinstance(tree, Mapping):
        kind = "tensor" if isinstance(tree, TensorRef) else type(tree).__name__
        raise Refused(
            f"{what} holds a {kind}, not a state dict: save model.state_dict() "
            "(and the optimizer state) in a dict instead of the object itself"
        )
    checkpoint = Checkpoint(root=tree)
    empty = [] if model_key or optim_key else _empty_entries(tree)
    _find_optimizer(checkpoint, tree, what, optim_key)
    if not empty:  # else the top level's tensors (an RNG state) are no model: the file is refused below
        _find_model(checkpoint, tree, what, model_key)
    if checkpoint.optim_flat:
        checkpoint.optimizer = unflatten_optim(checkpoint.optimizer, checkpoint.model or ())
    top = {
        checkpoint.model_path[0] if checkpoint.model_path else None,
        checkpoint.optim_path[0] if checkpoint.optim_path else None,
    }
    model_entries = set(checkpoint.model) if checkpoint.model_path == () else set()
    if checkpoint.optim_path != ():
        checkpoint.extras = {k: v for k, v in tree.items() if k not in top and k not in model_entries}
    _refuse(checkpoint, what)
    if empty:
        raise _empty_refusal(what, f" under {empty[0]!r}")
    return checkpoint


def _find_optimizer(checkpoint: Checkpoint, tree, what, optim_key):
    if optim_key:
        path = dotted(optim_key)
        value = get_path(tree, path)
        if value is None:
            raise ConvertError(f"--optim-key {optim_key}: no such entry in {what}")
        if not (is_nested_optim(value) or is_flat_optim(value)):
            raise ConvertError(f"--optim-key {optim_key}: not an optimizer state dict (no 'state' and 'param_groups')")
    elif is_nested_optim(tree):
        path, value = (), tree
    else:
        path = next(((k,) for k in OPTIM_KEYS if is_nested_optim(tree.get(k)) or is_flat_optim(tree.get(k))), None)
        if path is None:
            return
        value = tree[path[0]]
    checkpoint.optim_path = path
    checkpoint.optim_flat = is_flat_optim(value)
    checkpoint.optimizer = value


def _find_model(checkpoint: Checkpoint, tree, what, model_key):
    if model_key:
        path = dotted(model_key)
        value = get_path(tree, path)
        if not isinstance(value, Mapping):
            raise ConvertError(f"--model-key {model_key}: no state dict at that key in {what}")
        checkpoint.model_path, checkpoint.model = path, dict(value)
        return
    if checkpoint.optim_path == ():
        return
    for key in MODEL_KEYS:
        value = tree.get(key)
        if isinstance(value, Mapping) and has_tensor(value):
            checkpoint.model_path, checkpoint.model = (key,), dict(value)
            return
    top_tensors = {k: v for k, v in tree.items() if isinstance(v, TensorRef)}
    if top_tensors:
        checkpoint.model_path, checkpoint.model = (), top_tensors


def _empty_refusal(what: str, where: str = "") -> Refused:
    return Refused(
        f"{what} holds no tensors{where} (an empty state dict): with rank0_only=True only rank 0 receives the full "
        "state dict, so the other ranks' files are empty; convert the file written by rank 0"
    )


def _empty_entries(tree: Mapping) -> list[str]:
    """The model and optimizer entries that are empty: a rank>0 file of a rank0_only save is `{"model": {},
    "optimizer": {}}` plus whatever else the loop saved (epoch, RNG state), which is no model."""
    return [key for key in MODEL_KEYS + OPTIM_KEYS if isinstance(tree.get(key), Mapping) and not tree[key]]


def _refuse(checkpoint: Checkpoint, what):
    model, optimizer = checkpoint.model or {}, checkpoint.optimizer
    if not has_tensor(model) and not has_tensor(optimizer) and not has_tensor(checkpoint.extras):
        raise _empty_refusal(what)
    if any(not isinstance(k, str) for k in model):
        raise Refused(f"{what}: the model state dict has non-string keys; it is not a module state dict")
    flat_params = [k for k in model if k.split(".")[-1] in ("flat_param", "_flat_param")]
    if flat_params:
        raise Refused(
            f"{what} holds FSDP1 flat parameters ({flat_params[0]}): a LOCAL_STATE_DICT cannot be unflattened "
            "without the FSDP1 model; load it there and save a FULL_STATE_DICT"
        )
    if optimizer is not None:
        ids = [k for k in optimizer[STATE] if not isinstance(k, str)] + [
            p
            for group in optimizer[PARAM_GROUPS]
            if isinstance(group, Mapping)
            for p in group.get(PARAMS, ())
            if not isinstance(p, str)
        ]
        if ids:
            raise Refused(
                f"{what} holds a raw optimizer.state_dict() (state keyed by integer ids; under FSDP1 these are flat, "
                "sharded tensors): save FSDP.optim_state_dict(model, optimizer) under StateDictType.FULL_STATE_DICT "
                "instead"
            )


def unflatten_optim(flat: Mapping, param_names) -> dict:
    """torchtitan's flattened optimizer (`state.<fqn>.<k>`, `param_groups.<fqn>.<k>`) in the nested form.

    Parameters whose hyperparameters are equal share a group, in order of first appearance.
    """
    known = sorted(param_names, key=len, reverse=True)
    state: dict = {}
    per_param: dict = {}
    for key, value in flat.items():
        section, rest = key.split(".", 1)
        if section == STATE:
            fqn = next((n for n in known if rest.startswith(n + ".")), rest.rsplit(".", 1)[0])
            node = state.setdefault(fqn, {})
            parts = rest[len(fqn) + 1 :].split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        else:
            fqn, name = rest.rsplit(".", 1)
            per_param.setdefault(fqn, {})[name] = value
    groups: list[dict] = []
    for fqn, hyper in per_param.items():
        group = next((g for g in groups if {k: v for k, v in g.items() if k != PARAMS} == hyper), None)
        if group is None:
            group = {**hyper, PARAMS: []}
            groups.append(group)
        group[PARAMS].append(fqn)
    return {STATE: state, PARAM_GROUPS: groups}


def flatten_optim(nested: Mapping) -> dict:
    """The nested optimizer state in torchtitan's flattened form (get_optimizer_state_dict with
    StateDictOptions(flatten_optimizer_state_dict=True))."""
    flat: dict = {}

    def put(prefix, value):
        if isinstance(value, Mapping):
            for key, item in value.items():
                put(f"{prefix}.{key}", item)
        else:
            flat[prefix] = value

    for fqn, param_state in nested[STATE].items():
        put(f"{STATE}.{fqn}", param_state)
    for group in nested[PARAM_GROUPS]:
        for fqn in group[PARAMS]:
            for key, value in group.items():
                if key != PARAMS:
                    flat[f"{PARAM_GROUPS}.{fqn}.{key}"] = value
    return flat
