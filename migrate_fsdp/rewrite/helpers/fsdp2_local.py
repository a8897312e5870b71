"""Inserted into a sum over a model's parameters or gradients that the code all-reduces by
hand (MF216), where the model may be FSDP2's or any other: FSDP1 showed each rank its
shard, as a plain tensor, and the all-reduce added the shards' sums up."""

from torch.distributed.tensor import DTensor


def fsdp2_local(tensor):
    """This rank's shard of an FSDP2 parameter or gradient (a DTensor), as FSDP1 showed
    it; any other tensor as it is, an FSDP1 shard included."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
