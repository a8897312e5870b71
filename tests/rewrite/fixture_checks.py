"""Checks every codemod fixture pair goes through, shared by the fixture tests.

A case is a folder `fixtures/rewrite/<case>/` with `before.py`, the exact
expected `after.py`, and `diagnostics.txt`: the exact diagnostics of the
rewrite of before.py, one `before.py:LINE:COL: CODE message` a line (empty
when everything converts).
"""

from collections import Counter
from pathlib import Path

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from migrate_fsdp.rewrite.api import rewrite_source
from migrate_fsdp.rewrite.diagnostics import TODO_PREFIX, TODO_WIDTH
from migrate_fsdp.rewrite.selection import LEFTOVER, Selection

_STATEMENTS = (cst.SimpleStatementLine, cst.BaseCompoundStatement, cst.Else, cst.Finally, cst.ExceptHandler)


def expected_diagnostics(case: Path) -> list[str]:
    path = case / "diagnostics.txt"
    return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def unmarked_leftovers(code: str) -> list[str]:
    """FSDP1 references in `code` with no TODO comment on their statement or a block around it.

    Independent of the rules: a leftover-only run finds every FSDP1
    reference, and the parse of the output says whether a TODO sits above
    the statement holding it.
    """
    only_leftovers = Selection(frozenset({LEFTOVER}))
    found = rewrite_source(code, "after.py", only_leftovers, todo=False).diagnostics
    if not found:
        return []
    wrapper = MetadataWrapper(cst.parse_module(code))
    positions = wrapper.resolve(PositionProvider)
    statements = [(positions[node], node) for node in positions if isinstance(node, _STATEMENTS)]
    missing = []
    for diagnostic in found:
        holding = [
            (pos, node)
            for pos, node in statements
            if (pos.start.line, pos.start.column) <= (diagnostic.line, diagnostic.col - 1) <= (pos.end.line, pos.end.column)
        ]
        # the statement holding it, or a block around it (one TODO above a block covers its lines)
        comments = [line.comment.value for _, statement in holding for line in statement.leading_lines if line.comment]
        if not any(c.startswith("# TODO(migrate-fsdp):") for c in comments):
            missing.append(str(diagnostic))
    return missing


def check_case(case: Path) -> None:
    before = (case / "before.py").read_bytes()
    expected = (case / "after.py").read_bytes()
    result = rewrite_source(before, "before.py")

    assert [str(d) for d in result.diagnostics] == expected_diagnostics(case)
    assert result.new_source.decode() == expected.decode(), f"{case.name}: rewrite differs from after.py"
    cst.parse_module(result.new_source)

    again = rewrite_source(result.new_source, "before.py")
    assert again.new_source == result.new_source, f"{case.name}: a second run changes the file"
    # A second run says nothing new (it may say less: what the first run made FSDP2 is FSDP2 code now).
    assert not Counter((d.code, d.message) for d in again.diagnostics) - Counter(
        (d.code, d.message) for d in result.diagnostics
    ), f"{case.name}: a second run reports something new"
    todo_lines = [line for line in result.code.splitlines() if line.lstrip().startswith(TODO_PREFIX)]
    for diagnostic in result.diagnostics:
        assert any(diagnostic.code in line for line in todo_lines), f"{case.name}: no TODO names {diagnostic.code}"
    assert long_todo_lines(result.code) == []
    assert unmarked_leftovers(result.code) == []


def long_todo_lines(code: str) -> list[str]:
    return [line for line in code.splitlines() if TODO_PREFIX in line and len(line) > TODO_WIDTH]
