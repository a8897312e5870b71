"""Code that runs only when the program says it uses FSDP: `if cfg.enable_fsdp:`, `if strategy == "fsdp":`.

Training loops shared by FSDP and plain or DDP runs take the model as a
parameter and pick the FSDP1 call by a flag of the run's configuration:

    if train_config.enable_fsdp:
        model.clip_grad_norm_(max_norm)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)

Nothing in the file says what `model` is, but the guard does: the branch is
the FSDP one. A guard names FSDP when its test is a flag or attribute whose
name says fsdp (`enable_fsdp`, `cfg.fsdp`, `is_fsdp`), or an equality with a
string or member naming it (`== "fsdp"`, `== DistributedStrategy.fsdp`); the
branch is the body of a plain test, the else of a negated one. `or` tests
prove nothing.

`isinstance(model, FSDP)` says it outright: under it, `model` is an FSDP1 model
(`model.module if isinstance(model, FSDP) else model`), wherever it came from.
"""

import libcst as cst

from migrate_fsdp.rewrite.analysis.models import SUMMON_FULL_PARAMS
from migrate_fsdp.rewrite.syntax import dotted


def in_fsdp_branch(stack) -> bool:
    """Whether the innermost node of `stack` runs only on a branch a guard naming FSDP takes."""
    return _on_branch(stack, taken=True)


def in_non_fsdp_branch(stack) -> bool:
    """Whether the innermost node of `stack` runs only on a branch a guard naming FSDP does not take
    (`cpu_state if args.fsdp else model.state_dict()`)."""
    return _on_branch(stack, taken=False)


def _on_branch(stack, taken: bool) -> bool:
    for index, node in enumerate(stack[:-1]):
        child = stack[index + 1]
        if isinstance(node, (cst.If, cst.IfExp)):
            sense = _names_fsdp(node.test)
            if sense is None:
                continue
            if child is node.body and sense is taken or child is node.orelse and sense is not taken:
                return True
    return False


def _names_fsdp(test) -> bool | None:
    """True: the test holds when FSDP is used; False: when it is not; None: it says neither."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _names_fsdp(test.expression)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        left, right = _names_fsdp(test.left), _names_fsdp(test.right)
        return True if True in (left, right) and False not in (left, right) else None
    if isinstance(test, (cst.Name, cst.Attribute)):
        return True if _says_fsdp(dotted(test).rsplit(".", 1)[-1]) else None
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        if not isinstance(target.operator, (cst.Equal, cst.NotEqual, cst.Is, cst.IsNot)):
            return None
        named = [side for side in (test.left, target.comparator) if _value_says_fsdp(side)]
        if len(named) != 1:
            return None
        return isinstance(target.operator, (cst.Equal, cst.Is))
    return None


def _value_says_fsdp(node) -> bool:
    if isinstance(node, cst.SimpleString):
        return _says_fsdp(str(node.evaluated_value))
    return isinstance(node, cst.Attribute) and _says_fsdp(node.attr.value)


def _says_fsdp(word: str) -> bool:
    word = word.lower()
    return "fsdp" in word and "fsdp2" not in word and not word.startswith(("no_fsdp", "not_fsdp", "disable"))


def checked_instance(ctx, stack, receiver: str, cls: str) -> bool:
    """Whether the innermost node of `stack` runs only when `isinstance(receiver, cls)` is true (`receiver`: the
    code of a name or attribute chain, `cls`: a qualified class name)."""
    return _under_test(ctx, stack, "builtins.isinstance", receiver, lambda second: ctx.matches(second, cls))


def unwraps_if_wrapped(ctx, stack, receiver: str) -> bool:
    """Whether the innermost node of `stack` (a `receiver.module` read) runs only when
    `hasattr(receiver, "module")`: the unwrap idiom (`if hasattr(model, "module"): model = model.module`,
    transformers' `unwrap_model`), which serves FSDP1's wrapper and DDP's, and leaves an FSDP2 model, which is
    the module itself, as it is."""
    return _under_test(
        ctx,
        stack,
        "builtins.hasattr",
        receiver,
        lambda second: isinstance(second, cst.SimpleString) and second.evaluated_value == "module",
    )


def _under_test(ctx, stack, function: str, receiver: str, second_matches) -> bool:
    """The innermost node of `stack` is in the body of an `if` testing `function(receiver, second)`."""
    for index, node in enumerate(stack[:-1]):
        if isinstance(node, (cst.If, cst.IfExp)) and stack[index + 1] is node.body:
            test = node.test
            if (
                isinstance(test, cst.Call)
                and ctx.matches(test.func, function)
                and len(test.args) == 2
                and dotted(test.args[0].value) == receiver
                and second_matches(test.args[1].value)
            ):
                return True
    return False


def in_summon(ctx, stack, receiver: str | None = None) -> bool:
    """Whether the innermost node of `stack` is inside `with FSDP.summon_full_params(...)` (of `receiver`, the code
    of the model, when given)."""
    return any(
        isinstance(node, cst.With)
        and any(
            isinstance(item.item, cst.Call)
            and ctx.matches(item.item.func, SUMMON_FULL_PARAMS)
            and (receiver is None or bool(item.item.args) and ctx.code(item.item.args[0].value) == receiver)
            for item in node.items
        )
        for node in stack
    )
