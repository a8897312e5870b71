"""MF104 inserts this where FSDP1's mixed_precision is known only at run time (a MixedPrecision built in
another module, returned by the user's function): the FSDP1 object stays the user's configuration and is
read by its public fields here, so only FSDP2 policies reach fully_shard."""

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.modules.batchnorm import _BatchNorm


def _fsdp1_mixed_precision(mixed_precision):
    """What FSDP1's `mixed_precision` (a MixedPrecision or None) did, as FSDP2 settings by name
    (a MixedPrecisionPolicy, once the user's config is FSDP2's, is used as it is).

    `root` casts its forward inputs under cast_root_forward_inputs or cast_forward_inputs, auto-wrapped
    `children` under cast_forward_inputs; the `full_precision_classes` FSDP1 wrapped on their own in
    float32 (its _module_classes_to_ignore field) get `full_precision`, whose outputs are in param_dtype;
    floating buffers are cast to `buffer_dtype` after sharding. keep_low_precision_grads has no FSDP2 form.
    """
    if mixed_precision is None or isinstance(mixed_precision, MixedPrecisionPolicy):  # no mixed precision, or FSDP2's already
        policy = mixed_precision or MixedPrecisionPolicy()
        return {"root": policy, "children": policy, "full_precision_classes": (), "full_precision": policy, "buffer_dtype": None}
    if mixed_precision.keep_low_precision_grads:
        raise NotImplementedError("MixedPrecision(keep_low_precision_grads=True): FSDP2 keeps gradients in the parameters' dtype")
    param_dtype, reduce_dtype = mixed_precision.param_dtype, mixed_precision.reduce_dtype
    cast, cast_root = mixed_precision.cast_forward_inputs, mixed_precision.cast_root_forward_inputs
    full_precision = MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=param_dtype) if param_dtype is not None else MixedPrecisionPolicy()
    return {
        "root": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=cast_root or cast),
        "children": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=cast),
        "full_precision_classes": tuple(getattr(mixed_precision, "_module_classes_to_ignore", (_BatchNorm,))),
        "full_precision": full_precision,
        "buffer_dtype": mixed_precision.buffer_dtype,
    }
