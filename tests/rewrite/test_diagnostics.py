"""The TODO line and the report line: one line each, the TODO within the width at any indentation."""

from migrate_fsdp.rewrite.diagnostics import TODO_REASONS, TODO_WIDTH, Diagnostic, todo_comment
from migrate_fsdp.rewrite.selection import all_codes


def test_every_code_has_a_short_reason():
    assert set(all_codes()) == set(TODO_REASONS)


def test_every_reason_fits_at_a_deep_indentation():
    for code in TODO_REASONS:
        assert 24 + len(todo_comment([code])) <= TODO_WIDTH, code


def test_codes_merge_and_reasons_drop_whole_when_too_long():
    assert todo_comment(["MF105", "MF104", "MF105"]) == (
        "# TODO(migrate-fsdp): MF104, MF105 FSDP1 mixed precision left as is; FSDP1 CPU offload left as is"
    )
    deep = todo_comment(["MF104", "MF105"], indent=16)
    assert deep == "# TODO(migrate-fsdp): MF104, MF105 FSDP1 mixed precision left as is"
    assert todo_comment(["MF104", "MF105"], indent=80) == "# TODO(migrate-fsdp): MF104, MF105"


def test_report_line_has_no_raw_newlines():
    diagnostic = Diagnostic("t.py", 3, 5, "MF101", "FSDP(...) left as is: `FSDP(\n        model,\n    )` unknown")
    assert str(diagnostic) == "t.py:3:5: MF101 FSDP(...) left as is: `FSDP( model, )` unknown"
