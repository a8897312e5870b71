"""The full checkpoint, FSDP2 version: full state dicts gathered to rank 0 on the CPU."""

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict


def save_full(model, optimizer, path):
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {"model": get_model_state_dict(model, options=options),
             "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}
    if dist.get_rank() == 0:
        torch.save(state, path)
