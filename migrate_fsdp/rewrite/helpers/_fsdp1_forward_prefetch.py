"""MF109 inserts this for FSDP1's forward_prefetch=True: the forward order is known
only after a forward."""

from torch.distributed.fsdp import FSDPModule


def _fsdp1_forward_prefetch(root):
    """FSDP1's forward_prefetch=True: after the first forward, each FSDP module
    prefetches the next one."""
    order, hooks = [], []

    def record(module, args):
        if module not in order:
            order.append(module)

    def finish(module, args, output):
        for hook in hooks:
            hook.remove()
        for index in range(1, len(order)):
            order[index - 1].set_modules_to_forward_prefetch([order[index]])

    hooks.extend(
        m.register_forward_pre_hook(record)
        for m in root.modules()
        if isinstance(m, FSDPModule)
    )
    hooks.append(root.register_forward_hook(finish))
