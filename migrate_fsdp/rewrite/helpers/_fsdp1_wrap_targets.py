"""MF102 inserts this where FSDP1's auto_wrap_policy is known only at run time (or is
size-based): FSDP2 has no auto-wrapping, so the modules FSDP1 would have wrapped are
found here, without FSDP1."""


def _fsdp1_wrap_targets(
    root, policy, ignored_modules=(), ignored_params=(), full_precision=()
):
    """The submodules FSDP1's auto_wrap_policy wrapped, children before parents (the
    root excluded).

    Walks the model as FSDP1's _recursive_wrap does, asking
    policy(module=, recurse=, nonwrapped_numel=): function policies and
    ModuleWrapPolicy answer that; a tuple of classes (transformer_auto_wrap_policy's
    or ModuleWrapPolicy's, converted where it was defined) picks their instances.
    `full_precision` are the classes FSDP1 also wrapped on their own under mixed
    precision (a class or a tuple, as isinstance takes them; `()` without mixed
    precision, where FSDP1 did not force recursion); `ignored_modules` are whole
    subtrees. A policy of None (FSDP1's default, or chosen at run time) wraps nothing.
    """
    if policy is None:
        return []
    if isinstance(policy, tuple):
        classes = policy

        def policy(module, recurse, nonwrapped_numel):
            return recurse or isinstance(module, classes)

    if not callable(policy):  # CustomPolicy: FSDP1 reads it through private API only
        raise NotImplementedError(
            f"{policy!r}: call fully_shard on the modules its function picks, "
            "children first"
        )
    full_precision = (
        tuple(full_precision)
        if isinstance(full_precision, (tuple, list))
        else (full_precision,)
    )
    targets = []

    def wrap(module, recurse, nonwrapped_numel):
        if full_precision and (recurse or isinstance(module, full_precision)):
            return True
        return policy(module=module, recurse=recurse, nonwrapped_numel=nonwrapped_numel)

    def walk(module, is_root=False):
        nonwrapped_numel = sum(
            p.numel() for p in module.parameters() if p not in ignored_params
        )
        if not wrap(module, True, nonwrapped_numel):
            return 0
        wrapped_numel = sum(
            walk(child) for child in module.children() if child not in ignored_modules
        )
        if not is_root and wrap(module, False, nonwrapped_numel - wrapped_numel):
            targets.append(module)
            return nonwrapped_numel
        return wrapped_numel

    walk(root, is_root=True)
    return targets
