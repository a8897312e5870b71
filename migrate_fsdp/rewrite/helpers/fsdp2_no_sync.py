"""MF201 inserts this where FSDP1's `model.no_sync()` was: FSDP2 has only the setter,
no context manager. A loop shared by DDP and FSDP runs hands it DDP models too."""

from contextlib import contextmanager

from torch.distributed.fsdp import FSDPModule


@contextmanager
def fsdp2_no_sync(module):
    """FSDP1's `module.no_sync()` for an FSDP2 module: no gradient reduction inside the
    block. Any other module (DDP, an FSDP1 model) keeps its own `no_sync()`.

    On exit, exceptions included, sync is turned back on unless an enclosing
    block still holds it off, as FSDP1 restored its previous setting.
    """
    if not isinstance(module, FSDPModule):
        with module.no_sync():
            yield
        return
    outer = getattr(module, "_fsdp2_no_sync_active", False)
    module.set_requires_gradient_sync(False)
    module._fsdp2_no_sync_active = True
    try:
        yield
    finally:
        module._fsdp2_no_sync_active = outer
        module.set_requires_gradient_sync(not outer)
