"""`fsdp2_reshard(model)` put before a statement, where FSDP2 may still hold a model unsharded.

FSDP1 put every module back on its sharded parameters after each forward,
the root included. FSDP2 keeps the root's parameters (and those sharded
with reshard_after_forward=False) unsharded after a forward until a
backward runs, which an evaluation under no_grad never has. Code that
follows one then meets plain tensors where FSDP1 had shards: an in-place
EMA update mixes Tensor and DTensor (MF214), a summoned block reads the
working copies (MF204), and the state-dict calls that go through the
optimizer's or the model's sharded parameters fail
(`set_model_state_dict`: "mixed torch.Tensor and DTensor";
`get_optimizer_state_dict` / `set_optimizer_state_dict`: `KeyError`),
as in the usual "train, evaluate, save" loop. Resharding first, as FSDP1
had, is a no-op on a model already sharded.
"""

import re

import libcst as cst

from migrate_fsdp.rewrite.analysis.guards import in_summon

HELPER_NAME = "fsdp2_reshard"
_FACTS = "fsdp2_reshard"


def reshard_before(ctx, model: cst.BaseExpression) -> None:
    """`fsdp2_reshard(model)` before the statement being visited, unless the model is sharded there already: the
    statements before it in its block reshard it, or take or load its state dicts (which leave it sharded), with
    no other use of it in between; a file rewritten before gets nothing more on a second run."""
    if not ctx.can_insert_statements():
        return
    statement = ctx.statement()
    wanted = ctx.code(model)
    asked = ctx.facts.setdefault(_FACTS, set())  # (statement id, model) pairs that asked, resharded or not
    if (id(statement), wanted) in asked:
        return
    asked.add((id(statement), wanted))
    # inside a summon block of the model, the summon rule (MF204) reshards at the top of the block
    if _sharded_before(ctx, statement, wanted, asked) or in_summon(ctx, ctx.stack, wanted):
        return
    helper = ctx.add_helper(HELPER_NAME)
    call = cst.Call(func=cst.Name(helper), args=[cst.Arg(model.deep_clone())])
    ctx.insert_before([cst.SimpleStatementLine([cst.Expr(call)])])


def reshards(ctx, statement) -> str | None:
    """The code of the model `statement` reshards with the helper (`fsdp2_reshard(model)`), if it does."""
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
    call = small.value if isinstance(small, cst.Expr) else None
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value.startswith(HELPER_NAME)):
        return None
    return ctx.code(call.args[0].value) if len(call.args) == 1 else None


def _sharded_before(ctx, statement, wanted: str, asked: set) -> bool:
    block = next((n for n in reversed(ctx.stack) if isinstance(n, (cst.IndentedBlock, cst.Module))), None)
    body = list(block.body) if block is not None else []
    index = next((i for i, s in enumerate(body) if s is statement), None)
    mention = re.compile(rf"(?<![\w.]){re.escape(wanted)}(?!\w)")
    for previous in reversed(body[:index] if index is not None else []):
        resharded = reshards(ctx, previous)
        if resharded == wanted or (id(previous), wanted) in asked:
            return True
        if resharded is None and mention.search(ctx.code(previous)):
            return False  # a forward, or a function it is handed to, may leave it unsharded
    return False
