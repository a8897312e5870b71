"""MF110 inserts this where FSDP1's param_init_fn initialised weights (`reset_parameters()`
of modules built on the meta device), before each fully_shard call: FSDP1 ran the
function on the whole, unsharded modules of each unit before sharding it, and with
sync_module_states then broadcast rank 0's weights of that unit."""

from torch.distributed import broadcast, get_global_rank
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def fsdp1_param_init(module, param_init_fn, sync_module_states=False, device=None, process_group=None):
    """`module`, after FSDP1's param_init_fn ran on it as FSDP1 ran it before sharding
    it: where the module, but for what is sharded already, holds tensors on the meta
    device, on the module and on each submodule not sharded yet, breadth first (all
    listed before any runs). With the units sharded children first, each runs on full
    tensors, in FSDP1's order. With sync_module_states, the tensors not sharded yet
    are then moved to `device` (FSDP1's device_id) and take the values of the first
    rank of `process_group` (the world's rank 0 without one)."""
    unsharded = [p for p in module.parameters() if not isinstance(p, DTensor)]
    if any(t.is_meta for t in [*unsharded, *module.buffers()]):
        if param_init_fn is None:  # FSDP1 called reset_parameters() on the device it was given
            raise NotImplementedError(
                f"{type(module).__name__} is on the meta device and param_init_fn is None: "
                "materialise and initialise it before fully_shard"
            )
        queue, seen = [module], {module}
        for current in queue:
            for child in current.children():
                if child not in seen and not isinstance(child, FSDPModule):
                    seen.add(child)
                    queue.append(child)
        for current in queue:
            param_init_fn(current)
    if sync_module_states:
        unsharded = [p for p in module.parameters() if not isinstance(p, DTensor)]
        source = 0 if process_group is None else get_global_rank(process_group, 0)
        for tensor in [*unsharded, *module.buffers()]:
            if device is not None and tensor.device.type == "cpu":
                tensor.data = tensor.to(device)
            broadcast(tensor.detach(), src=source, group=process_group)
    return module
