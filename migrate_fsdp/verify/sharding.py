"""FSDP units of a model found at run time, and global norms that do not depend on sharding.

FSDP1 optimizers hold FlatParameters (use_orig_params=False) or views into
them (use_orig_params=True); FSDP2 optimizers hold DTensors sharded per
parameter. Each rank therefore holds different slices under the two versions,
and some slices are replicated (NO_SHARD, the replicate dimension of HYBRID).
To give figures that compare across versions, only the first replica of each
slice contributes and a single all-reduce over the world sums the rest. Sums
of squares are taken in float64 (the square of a float32 is exact there); the
digest sums the raw bit patterns as integers, which is exact and independent
of the order and of how the elements were split between ranks.
"""

import gc
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.tensor import DTensor

FSDP1_PREFIX = "_fsdp_wrapped_module."
_RESHARDING_STRATEGIES = {ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD}
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Units:
    """The FSDP units of the model(s) an optimizer trains, keyed by module FQN."""

    modules: dict  # fqn -> module
    settings: dict  # fqn -> {setting: value}, JSON-ready
    primary: dict  # id(parameter) -> whether this rank holds its first replica


def find_units(params=None) -> Units:
    """Find the FSDP units among every live module (the probe cannot see the script's variables).

    With `params`, only the models that own one of them count: a script may
    keep earlier models alive, or train several.
    """
    # type() rather than isinstance(): some live objects (torch.distributed's
    # deprecated `reduce_op`) warn when their __class__ is looked up.
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), nn.Module)]
    children = {id(child) for module in modules for child in module._modules.values() if child is not None}
    roots = [m for m in modules if id(m) not in children and any(_is_unit(x) for x in m.modules())]
    if params is not None:
        wanted = {id(p) for p in params}
        roots = [root for root in roots if any(id(p) in wanted for p in root.parameters())]
    found, settings, primary = {}, {}, {}
    for root, label in zip(roots, _root_labels(roots)):
        prefix = f"{label}:" if len(roots) > 1 else ""
        for name, module in root.named_modules():
            if not _is_unit(module):
                continue
            fqn = prefix + name.replace(FSDP1_PREFIX, "")
            found[fqn] = module
            if isinstance(module, FSDP1):
                settings[fqn] = _fsdp1_settings(module)
                primary.update(_fsdp1_primary(module))
            else:
                settings[fqn] = _fsdp2_settings(module)
    return Units(found, settings, primary)


def _root_labels(roots: list) -> list:
    """Several models (say, a student and a teacher): label each by its class, numbered when classes repeat."""
    labels, seen = [], {}
    for root in roots:
        name = _class_name(root)
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels


def _is_unit(module) -> bool:
    return isinstance(module, (FSDP1, FSDPModule))


def _class_name(module) -> str:
    if isinstance(module, FSDP1):
        module = module.module
    if isinstance(module, FSDPModule):
        return type(module).__mro__[type(module)._orig_cls_mro_index].__name__
    return type(module).__name__


def dtype_name(dtype) -> str | None:
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def _owns_no_parameters(origin: str) -> dict:
    """A unit without parameters of its own (a root whose every parameter sits in a wrapped child).

    It shards and communicates nothing, so none of its settings has an effect:
    FSDP1 still reports its process group's size, FSDP2 has no parameter group
    to read them from. Both versions describe it the same way.
    """
    return {"shard_size": None, "replicate_size": None, "reshard_after_forward": None, "param_dtype": None,
            "reduce_dtype": None, "offload_params": None, "origin": origin}


def _fsdp1_settings(unit: FSDP1) -> dict:
    strategy = unit.sharding_strategy
    handle = unit._handle
    if handle is None:
        return _owns_no_parameters(f"FSDP1 {strategy.name}")
    if strategy == ShardingStrategy.NO_SHARD:
        shard, replicate = 1, unit.process_group.size()
    else:
        shard = unit.process_group.size()
        inter = getattr(unit, "_inter_node_pg", None)
        replicate = inter.size() if inter is not None and strategy.name.startswith(("HYBRID", "_HYBRID")) else 1
    reshard = strategy in _RESHARDING_STRATEGIES and not unit._is_root and shard > 1
    return {
        "shard_size": shard,
        "replicate_size": replicate,
        "reshard_after_forward": reshard,
        "param_dtype": dtype_name(handle._fwd_bwd_param_dtype),
        "reduce_dtype": dtype_name(handle._reduce_dtype),
        "offload_params": bool(unit.cpu_offload.offload_params),
        "origin": f"FSDP1 {strategy.name}",
    }


def _fsdp1_primary(unit: FSDP1) -> dict:
    handle = unit._handle
    if handle is None:
        return {}
    strategy = unit.sharding_strategy
    if strategy == ShardingStrategy.NO_SHARD:
        is_primary = unit.process_group.rank() == 0
    elif strategy.name.startswith(("HYBRID", "_HYBRID")):
        is_primary = unit._inter_node_pg.rank() == 0
    else:
        is_primary = True
    flat = handle.flat_param
    members = [flat, *(flat._params or []), *(flat._shared_params or [])]
    return {id(p): is_primary for p in members}


def _param_groups(module) -> list:
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # torch < 2.8 has a single optional group
        groups = [state._fsdp_param_group] if state._fsdp_param_group is not None else []
    return groups


def _fsdp2_settings(module) -> dict:
    groups = _param_groups(module)
    if not groups:
        return _owns_no_parameters("FSDP2")
    group = groups[0]
    info = group.mesh_info
    shard = getattr(info, "shard_mesh_size", 1)
    # From the policy rather than FSDPParam's dtype attributes, which exist only after lazy init.
    param_dtype = group.mp_policy.param_dtype or group.fsdp_params[0].sharded_param.dtype
    return {
        "shard_size": shard,
        "replicate_size": getattr(info, "replicate_mesh_size", 1),
        "reshard_after_forward": group.post_forward_mesh_info is not None and shard > 1,
        "param_dtype": dtype_name(param_dtype),
        "reduce_dtype": dtype_name(group.mp_policy.reduce_dtype or param_dtype),
        "offload_params": type(group.offload_policy).__name__ == "CPUOffloadPolicy",
        "origin": "FSDP2",
    }


def _is_primary_dtensor(param: DTensor) -> bool:
    coordinate = param.device_mesh.get_coordinate()
    if coordinate is None:
        return False
    return all(not p.is_replicate() or coordinate[dim] == 0 for dim, p in enumerate(param.placements))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().reshape(-1)


def _digest(flat: torch.Tensor) -> torch.Tensor:
    bits = flat.view(_BITS[flat.element_size()]).to(torch.int64)
    count = torch.tensor(flat.numel(), dtype=torch.int64, device=flat.device)
    return torch.stack([bits.sum(), ((bits * bits) & 0xFFFFFFFF).sum(), count])


def comm_device() -> torch.device:
    if "nccl" in str(dist.get_backend()) and "gloo" not in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def global_stats(params: list, primary: dict, use_grads: bool) -> tuple[float, list[int], int]:
    """(global norm, exact digest, element count) of the parameters or of their gradients.

    Identical on every rank.
    """
    world_rank = dist.get_rank()
    device = comm_device()
    sumsq = torch.zeros((), dtype=torch.float64, device=device)
    digest = torch.zeros(3, dtype=torch.int64, device=device)  # two bit sums, element count
    for param in params:
        tensor = param.grad if use_grads else param
        if tensor is None:
            continue
        if isinstance(param, DTensor):
            is_primary = _is_primary_dtensor(param)
        else:
            is_primary = primary.get(id(param), world_rank == 0)
        if not is_primary:
            continue
        flat = _local(tensor)
        if flat.numel() == 0:
            continue
        sumsq += torch.linalg.vector_norm(flat, dtype=torch.float64).square().to(device)
        digest += _digest(flat).to(device)
    dist.all_reduce(sumsq)
    dist.all_reduce(digest)
    *bits, numel = digest.tolist()
    return sumsq.sqrt().item(), bits, numel
