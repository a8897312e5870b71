"""The full checkpoint as FSDP1 users take it: FULL_STATE_DICT, gathered on rank 0."""

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save_full(model, optimizer, path):
    with FSDP.state_dict_type(
        model,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(rank0_only=True),
        FullOptimStateDictConfig(rank0_only=True),
    ):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer)}
    if dist.get_rank() == 0:
        torch.save(state, path)
