"""Whole-file codemod fixtures: exact output, exact diagnostics, fixed point, no unmarked leftovers."""

import pytest

from tests.rewrite.fixture_checks import check_case, long_todo_lines
from tests.support import FIXTURES

CASES = sorted(p for p in (FIXTURES / "rewrite").iterdir() if p.is_dir())


def test_there_are_cases():
    assert CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture(case):
    check_case(case)


def test_no_todo_line_is_longer_than_the_width():
    long = {case.name: long_todo_lines((case / "after.py").read_text()) for case in CASES}
    assert {name: lines for name, lines in long.items() if lines} == {}
