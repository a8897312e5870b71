"""MF102 inserts this for FSDP1's _or_policy (torch.distributed.fsdp.wrap) of policies it replays."""


def _fsdp1_or_policy(module, recurse, nonwrapped_numel, policies):
    """FSDP1's _or_policy: wrap when any of the policies would."""
    return any(policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel) for policy in policies)
