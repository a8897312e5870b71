"""MF110 inserts this where FSDP1's param_init_fn initialised weights (`reset_parameters()`
of modules built on the meta device), before each fully_shard call: FSDP1 ran the
function on the whole, unsharded modules of each unit before sharding it."""

from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def fsdp1_param_init(module, param_init_fn):
    """`module`, after FSDP1's param_init_fn ran on it as FSDP1 ran it before sharding
    it: where the module, but for what is sharded already, holds tensors on the meta
    device, on the module and on each submodule not sharded yet, breadth first. With
    the units sharded children first, each runs on full tensors, in FSDP1's order."""
    own = [p for p in module.parameters() if not isinstance(p, DTensor)]
    if not any(t.is_meta for t in [*own, *module.buffers()]):
        return module
    if param_init_fn is None:  # FSDP1 called reset_parameters() on the device it was given
        raise NotImplementedError(
            f"{type(module).__name__} is on the meta device and param_init_fn is None: "
            "materialise and initialise it before fully_shard"
        )
    queue, seen = [module], {module}
    while queue:
        current = queue.pop(0)
        param_init_fn(current)
        for child in current.children():
            if child not in seen and not isinstance(child, FSDPModule):
                seen.add(child)
                queue.append(child)
    return module
