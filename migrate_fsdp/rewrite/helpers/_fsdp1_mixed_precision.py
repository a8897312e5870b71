"""MF104 inserts this where FSDP1's mixed_precision is known only at run time (a
MixedPrecision built in another module, returned by the user's function): the FSDP1
object stays the user's configuration and is read by its public fields here, so only
FSDP2 policies reach fully_shard."""

from torch.distributed.fsdp import MixedPrecisionPolicy

from migrate_fsdp.rewrite.helpers.fsdp2_mixed_precision import fsdp2_mixed_precision


def _fsdp1_mixed_precision(mixed_precision):
    """What FSDP1's `mixed_precision` (a MixedPrecision or None) did, as FSDP2
    settings by name (see fsdp2_mixed_precision). Settings already in that form (a
    MixedPrecision converted where it is defined) are used as they are, and so is a
    MixedPrecisionPolicy, once the user's config is FSDP2's."""
    if isinstance(mixed_precision, dict):
        return mixed_precision
    # no mixed precision, or FSDP2's already
    if mixed_precision is None or isinstance(mixed_precision, MixedPrecisionPolicy):
        policy = mixed_precision or MixedPrecisionPolicy()
        return {
            "root": policy,
            "children": policy,
            "full_precision_classes": (),
            "full_precision": policy,
            "buffer_dtype": None,
        }
    names = (
        "param_dtype",
        "reduce_dtype",
        "buffer_dtype",
        "keep_low_precision_grads",
        "cast_forward_inputs",
        "cast_root_forward_inputs",
    )
    # its dataclass fields
    fields = {
        name: getattr(mixed_precision, name)
        for name in (*names, "_module_classes_to_ignore")
    }
    return fsdp2_mixed_precision(**fields)
