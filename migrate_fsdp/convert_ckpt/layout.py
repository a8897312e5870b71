"""What is written where: the output trees for `--layout keep|torchtitan|accelerate` and `--only model`.

keep: the input's nesting, so `dcp.load({"model": ..., "optimizer": ...})`
finds the keys the FSDP1 code saved under. torchtitan: model FQNs at the top,
the optimizer flattened under `optimizer` (its checkpointer's
`flatten_optimizer_state_dict=True`), extras as they are. accelerate: what
`Accelerator.save_state` writes for FSDP: `pytorch_model_fsdp_0/` and
`optimizer_0/` (DCP, keys `model.*` and `optimizer.*`), or
`pytorch_model_fsdp.bin` and `optimizer.bin` (torch), or `model.safetensors`;
extras, which Accelerate keeps in files of its own, go to `extra_state.pt`.
"""

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.structure import Checkpoint, flatten_optim, get_path
from migrate_fsdp.convert_ckpt.tensors import TensorRef

DCP, TORCH, SAFETENSORS = "dcp", "torch", "safetensors"
ACCELERATE_NAMES = {
    DCP: ("pytorch_model_fsdp_0", "optimizer_0"),
    TORCH: ("pytorch_model_fsdp.bin", "optimizer.bin"),
    SAFETENSORS: ("model.safetensors", None),
}
ACCELERATE_EXTRAS = "extra_state.pt"


@dataclass
class Output:
    name: str  # path inside DST; "" is DST itself
    kind: str
    tree: dict


@dataclass
class Plan:
    outputs: list[Output]
    dst_is_dir: bool
    model_path: tuple | None = None  # where the model sits in the written tree (for the loading snippet)
    optim_path: tuple | None = None
    extras: list[str] = field(default_factory=list)


def _like(original, items: dict):
    """`items` in a container of the original's type and attributes (OrderedDict with `_metadata`)."""
    if type(original) is dict or not isinstance(original, dict):
        return dict(items)
    rebuilt = copy.copy(original)
    rebuilt.clear()
    rebuilt.update(items)
    return rebuilt


def _replace(tree, path: tuple, value):
    if not path:
        return value
    rebuilt = copy.copy(tree)
    rebuilt[path[0]] = _replace(tree.get(path[0], {}), path[1:], value)
    return rebuilt


def _keep_tree(checkpoint: Checkpoint, model, optimizer, only_model: bool):
    if checkpoint.optim_path == ():
        return optimizer, None, ()
    if only_model:
        if checkpoint.model_path == ():
            return _like(checkpoint.root, model), (), None
        return _replace({}, checkpoint.model_path, model), checkpoint.model_path, None
    root = checkpoint.root
    if checkpoint.model_path == ():
        entries = {k: v for k, v in root.items() if k not in checkpoint.model}
        root = _like(root, {**model, **entries})
    elif checkpoint.model_path is not None:
        root = _replace(root, checkpoint.model_path, model)
    if checkpoint.optim_path is not None:
        stored = flatten_optim(optimizer) if checkpoint.optim_flat else optimizer
        root = _replace(root, checkpoint.optim_path, stored)
    return root, checkpoint.model_path, checkpoint.optim_path


def _torchtitan_tree(checkpoint: Checkpoint, model, optimizer, only_model: bool):
    tree = dict(model)
    if only_model:
        return tree
    if optimizer is not None:
        tree["optimizer"] = flatten_optim(optimizer)
    for key, value in checkpoint.extras.items():
        if key in tree:
            raise ConvertError(f"--layout torchtitan: the extra {key!r} has the name of a model key or 'optimizer'")
        tree[key] = value
    return tree


def plan_outputs(checkpoint: Checkpoint, model, optimizer, to: str, layout: str, only_model: bool, dst: str) -> Plan:
    """`model` and `optimizer` are the renamed (and cast) versions of the checkpoint's."""
    extras = [] if only_model else list(checkpoint.extras)
    needs_model = layout != "keep" or to == SAFETENSORS or only_model
    if needs_model and model is None:
        raise ConvertError(
            "no model state dict found (looked for the keys model, state_dict, model_state_dict, module, "
            "or tensors at the top level); name it with --model-key"
        )
    if model is not None and checkpoint.model_path is not None:
        model = _like(get_path(checkpoint.root, checkpoint.model_path) if checkpoint.model_path else {}, model)
    if to == SAFETENSORS and layout != "accelerate":
        if not only_model and (optimizer is not None or checkpoint.extras):
            raise ConvertError(
                "safetensors holds only the model's tensors: add --only model to leave out the optimizer state "
                "and the extras, or write --to dcp / --to torch to keep them"
            )
        return Plan([Output("", SAFETENSORS, model)], dst_is_dir=not dst.endswith(".safetensors"))
    if layout == "keep":
        tree, model_path, optim_path = _keep_tree(checkpoint, model, optimizer, only_model)
        return Plan([Output("", to, tree)], to == DCP, model_path, optim_path, extras)
    optim_path = ("optimizer",) if optimizer is not None and not only_model else None
    if layout == "torchtitan":
        tree = _torchtitan_tree(checkpoint, model, optimizer, only_model)
        return Plan([Output("", to, tree)], to == DCP, model_path=(), optim_path=optim_path, extras=extras)
    model_name, optim_name = ACCELERATE_NAMES[to]
    if to == SAFETENSORS:
        if not only_model and (optimizer is not None or checkpoint.extras):
            raise ConvertError("--layout accelerate --to safetensors writes only model.safetensors: add --only model")
        return Plan([Output(model_name, SAFETENSORS, model)], dst_is_dir=True)
    outputs = [Output(model_name, to, {"model": model} if to == DCP else model)]
    if optim_path:
        outputs.append(Output(optim_name, to, {"optimizer": optimizer} if to == DCP else optimizer))
    if extras:
        outputs.append(Output(ACCELERATE_EXTRAS, TORCH, dict(checkpoint.extras)))
    return Plan(outputs, dst_is_dir=True, model_path=("model",), optim_path=optim_path, extras=extras)


def sharded_tensor_ids(model, optimizer) -> set[int]:
    """The tensors FSDP2 shards: the model's and the optimizer state's (not extras such as RNG states)."""
    ids: set[int] = set()

    def collect(value):
        if isinstance(value, TensorRef):
            ids.add(id(value))
        elif isinstance(value, Mapping):
            for item in value.values():
                collect(item)

    collect(model or {})
    collect((optimizer or {}).get("state", {}))
    return ids
