"""MF102 inserts this for FSDP1's _or_policy (torch.distributed.fsdp.wrap) of policies
it replays; MF112 where one is defined apart from its FSDP(...) call, its policies
being FSDP1's, callables, or class tuples."""


def _fsdp1_or_policy(module, recurse, nonwrapped_numel, policies):
    """FSDP1's _or_policy: wrap when any of the policies would (a tuple of classes
    picks their instances)."""
    return any(
        (
            (recurse or isinstance(module, policy))
            if isinstance(policy, tuple)
            else policy(
                module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel
            )
        )
        for policy in policies
    )
