"""MF202 inserts this where FSDP1's state-dict type is known only at run time
(`cfg.checkpoint_type`)."""


def _fsdp1_full_state_dict(state_dict_type):
    """Whether FSDP1's state-dict type (a StateDictType member or its name) is
    FULL_STATE_DICT, for StateDictOptions(full_state_dict=...). SHARDED_STATE_DICT is
    FSDP2's sharded state dict, and so is LOCAL_STATE_DICT: each rank's own shards,
    by parameter name where FSDP1 had flat parameters."""
    name = getattr(state_dict_type, "name", state_dict_type)
    if name not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT"):
        raise ValueError(f"unknown FSDP1 state-dict type {state_dict_type!r}")
    return name == "FULL_STATE_DICT"
