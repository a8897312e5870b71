"""MF201 inserts this where FSDP1's `model.no_sync()` was: FSDP2 has only the setter,
no context manager."""

from contextlib import contextmanager


@contextmanager
def fsdp2_no_sync(module):
    """FSDP1's `module.no_sync()` for an FSDP2 module: no gradient reduction inside the
    block.

    On exit, exceptions included, sync is turned back on unless an enclosing
    block still holds it off, as FSDP1 restored its previous setting.
    """
    outer = getattr(module, "_fsdp2_no_sync_active", False)
    module.set_requires_gradient_sync(False)
    module._fsdp2_no_sync_active = True
    try:
        yield
    finally:
        module._fsdp2_no_sync_active = outer
        module.set_requires_gradient_sync(not outer)
