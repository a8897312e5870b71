"""Boolean FSDP1 arguments known only at run time (`sync_module_states=cfg.low_cpu_fsdp`).

What FSDP1 did where the flag held, the rewrite does under `if flag:`, so the
choice stays the user's. A flag that is not a plain name or attribute chain
is read once, into a variable before the call, as FSDP1 read it once.
"""

import libcst as cst

from migrate_fsdp.rewrite.rules.construction.codegen import expression


def flag(analysis, value: cst.BaseExpression, plan, name: str) -> bool | cst.BaseExpression | None:
    """True/False for a literal, else the expression to test (None when it uses other FSDP1 names)."""
    literal = analysis.literal_bool(value)
    if literal is not None:
        return literal
    if isinstance(value, cst.IfExp) and {analysis.literal_bool(value.body), analysis.literal_bool(value.orelse)} == {True, False}:
        # `True if cond else False` (a kwargs item set under `if cond:`): the condition is the flag
        value = value.test if analysis.literal_bool(value.body) else expression("not TEST", TEST=value.test)
    if analysis.fsdp1_references(value):
        return None
    return analysis.read_once(value, plan, name, f"fsdp1_{name}")


def guarded(when: bool | cst.BaseExpression, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """`body`, under `if when:` unless `when` is True."""
    if when is True:
        return body
    return [cst.If(test=when, body=cst.IndentedBlock(body))]
