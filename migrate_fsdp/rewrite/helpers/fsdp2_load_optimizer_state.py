"""Inserted for FSDP1's DCP resume, `load_sharded_optimizer_state_dict(model_state_dict, optimizer_key,
storage_reader)` (MF203): FSDP2 loads an optimizer's state into its own state dict, and torch.distributed.checkpoint
fills only what that names, a fresh optimizer's settings, where FSDP1's loader read every setting the checkpoint's
parameter groups hold (an LR scheduler's `initial_lr`, which a scheduler built after the load keeps)."""

import torch.distributed.checkpoint
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict


def fsdp2_load_optimizer_state(model, optim, key, storage_reader, planner=None):
    """The optimizer state saved under `key`, in the form FSDP2's set_optimizer_state_dict
    takes, with every parameter-group setting the checkpoint holds."""
    osd = get_optimizer_state_dict(model, optim)
    prefix = f"{key}.param_groups."
    for name in storage_reader.read_metadata().state_dict_metadata:
        index, _, setting = name[len(prefix) :].partition(".")
        if name.startswith(prefix) and index.isdigit() and int(index) < len(osd["param_groups"]):
            if setting and "." not in setting:
                osd["param_groups"][int(index)].setdefault(setting, None)  # dcp.load reads its value
    state = {key: osd}
    torch.distributed.checkpoint.load(state, storage_reader=storage_reader, planner=planner)
    return state[key]
