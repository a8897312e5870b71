"""MF110 inserts this where FSDP1's param_init_fn initialised weights: the modules are
sharded in the order FSDP1 wrapped them, so that the function runs on them in FSDP1's
order and draws the same random numbers."""


def _fsdp1_wrap_order(root):
    """The submodules of `root` as FSDP1's auto-wrapping visited them: children (in
    order) before their parents, each once; `root` excluded."""
    order, seen = [], {root}

    def visit(module):
        for child in module.children():
            if child not in seen:
                seen.add(child)
                visit(child)
                order.append(child)

    visit(root)
    return order
