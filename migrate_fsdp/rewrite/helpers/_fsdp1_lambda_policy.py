"""MF112 puts this where FSDP1's lambda_auto_wrap_policy is defined apart from its
FSDP(...) call."""


def _fsdp1_lambda_policy(module, recurse, nonwrapped_numel, lambda_fn):
    """FSDP1's lambda_auto_wrap_policy: look inside every module, wrap those
    `lambda_fn` picks."""
    return recurse or lambda_fn(module)
