"""MF203 inserts this where an FSDP1 optimizer state dict is loaded into an FSDP2
model's optimizer."""

from torch import Tensor


def fsdp1_unshared_steps(optim_state_dict):
    """The dict with a `step` of its own for every parameter: FSDP1's optimizer state
    dicts (and checkpoints saved from them) share one step tensor among the parameters
    of a flat parameter, and FSDP2's optimizer, keeping them shared, would advance it
    once per parameter. A rank's None or {} stays as it is."""
    if not optim_state_dict or "state" not in optim_state_dict:
        return optim_state_dict
    state = {
        key: {
            name: (
                value.clone()
                if isinstance(value, Tensor) and value.dim() == 0
                else value
            )
            for name, value in entry.items()
        }
        for key, entry in optim_state_dict["state"].items()
    }
    return {**optim_state_dict, "state": state}
