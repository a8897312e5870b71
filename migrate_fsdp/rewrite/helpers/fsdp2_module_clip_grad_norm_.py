"""MF205 inserts this where `model.clip_grad_norm_(max_norm)` is called on a model
the file cannot tell the origin of (a loop over a dict of models), which an FSDP1
model that converts may reach."""

from torch.distributed.fsdp import FSDPModule

from migrate_fsdp.rewrite.helpers.fsdp2_clip_grad_norm_ import fsdp2_clip_grad_norm_


def fsdp2_module_clip_grad_norm_(module, max_norm, norm_type=2.0):
    """FSDP1's `module.clip_grad_norm_()` for an FSDP2 module: clips its gradients in
    place, returns the global norm as a plain tensor. Any other module (an FSDP1 model)
    keeps its own method."""
    if not isinstance(module, FSDPModule):
        return module.clip_grad_norm_(max_norm, norm_type)
    return fsdp2_clip_grad_norm_(module.parameters(), max_norm, norm_type)
