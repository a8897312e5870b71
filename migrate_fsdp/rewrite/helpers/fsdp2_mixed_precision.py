"""MF112 puts this where a recipe defines FSDP1's MixedPrecision(...) apart from its
FSDP(...) call (a policies module): the same arguments give the FSDP2 settings, which
the converted constructor applies."""

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.modules.batchnorm import _BatchNorm


def fsdp2_mixed_precision(
    param_dtype=None,
    reduce_dtype=None,
    buffer_dtype=None,
    keep_low_precision_grads=False,
    cast_forward_inputs=False,
    cast_root_forward_inputs=True,
    _module_classes_to_ignore=(_BatchNorm,),
):
    """FSDP1's MixedPrecision(...) (same arguments) as the FSDP2 settings that do what
    it did, by name.

    The `root` casts its forward inputs under cast_root_forward_inputs or
    cast_forward_inputs, auto-wrapped `children` under cast_forward_inputs; the
    `full_precision_classes` FSDP1 wrapped on their own in float32 get
    `full_precision`, whose outputs are in param_dtype; floating buffers are cast to
    `buffer_dtype` after sharding (fully_shard does not cast buffers).
    keep_low_precision_grads has no FSDP2 form.
    """
    if keep_low_precision_grads:
        raise NotImplementedError(
            "MixedPrecision(keep_low_precision_grads=True): "
            "FSDP2 keeps gradients in the parameters' dtype"
        )
    full_precision = (
        MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=param_dtype)
        if param_dtype is not None
        else MixedPrecisionPolicy()
    )
    cast_root = cast_root_forward_inputs or cast_forward_inputs
    return {
        "root": MixedPrecisionPolicy(
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            cast_forward_inputs=cast_root,
        ),
        "children": MixedPrecisionPolicy(
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
            cast_forward_inputs=cast_forward_inputs,
        ),
        "full_precision_classes": tuple(_module_classes_to_ignore),
        "full_precision": full_precision,
        "buffer_dtype": buffer_dtype,
    }
