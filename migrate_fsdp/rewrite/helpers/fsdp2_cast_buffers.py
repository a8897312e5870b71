"""MF104 inserts this for FSDP1's MixedPrecision(buffer_dtype=...), which fully_shard
does not do."""

from torch.distributed.fsdp import FSDPModule


def fsdp2_cast_buffers(module, dtype, full_precision=(), ignored=()):
    """FSDP1's `buffer_dtype` for the modules one FSDP(...) call is about to shard:
    floating buffers to `dtype`.

    Call it before sharding `module`. As each FSDP1 unit cast only the buffers it
    owned, a submodule an earlier call sharded (its own unit, its own settings) keeps
    its buffers, and so do the `full_precision` classes FSDP1 kept in full precision
    (a class or a tuple, as isinstance takes them) and `ignored` modules.
    """
    if module in ignored or isinstance(module, full_precision):
        return
    for buffer in module.buffers(recurse=False):
        if buffer.is_floating_point():
            buffer.data = buffer.data.to(dtype)
    for child in module.children():
        if not isinstance(child, FSDPModule):
            fsdp2_cast_buffers(child, dtype, full_precision, ignored)
