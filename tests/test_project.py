"""Promises the project makes outside the code: the README's commands, and a docs page per rule code."""

import re

from migrate_fsdp.rewrite.selection import all_codes
from tests.support import REPO


def _readme_commands() -> list[str]:
    return re.findall(r"```\n(python -m pip install .+)\n```", (REPO / "README.md").read_text())


def test_readme_opens_with_the_main_job_then_the_tests():
    main_job, tests = _readme_commands()[:2]
    assert main_job.endswith("migrate-fsdp verify")
    assert tests.endswith("python -m pytest")


def test_ci_runs_the_readmes_test_command_as_written():
    tests = _readme_commands()[1]
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert tests in ci_lines


def test_every_rule_code_has_a_docs_page_with_an_example():
    missing = []
    for code in all_codes():
        page = REPO / "docs" / "rules" / f"{code}.md"
        if not page.exists() or "```" not in page.read_text():
            missing.append(code)
    assert not missing, f"rule codes without a docs/rules page with an example: {missing}"


def test_docs_link_only_to_pages_that_exist():
    broken = []
    for page in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken
