"""MF106 inserts this with the helpers reading FSDP1's sharding_strategy at run time."""


def _fsdp1_strategy_name(strategy):
    """The name of FSDP1's sharding_strategy (a member, its name, or None for FSDP1's
    default), checked: a misspelt name fails as FSDP1 would have."""
    name = "FULL_SHARD" if strategy is None else getattr(strategy, "name", strategy)
    if name not in (
        "FULL_SHARD",
        "SHARD_GRAD_OP",
        "HYBRID_SHARD",
        "_HYBRID_SHARD_ZERO2",
        "NO_SHARD",
    ):
        raise ValueError(f"unknown FSDP1 sharding strategy {strategy!r}")
    return name
