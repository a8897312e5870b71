"""Rules are discovered, not listed: every rule class written in a rules module runs, once, in family order."""

import re
from pathlib import Path

import migrate_fsdp.rewrite.rules as rules_package
from migrate_fsdp.rewrite.rules import RULES

RULES_DIR = Path(rules_package.__file__).parent


def test_every_rule_written_in_a_rules_module_is_discovered_once():
    written = {
        code
        for path in RULES_DIR.glob("*/*.py")
        for code in re.findall(r'^    code = "(MF\d+)"$', path.read_text(), flags=re.MULTILINE)
    }
    codes = [rule.code for rule in RULES]
    assert sorted(codes) == sorted(written)
    assert len(codes) == len(set(codes))


def test_construction_rules_run_before_training_rules_each_in_code_order():
    families = [rule.__module__.split(".")[-2] for rule in RULES]
    assert families == sorted(families, key=["construction", "training"].index)
    for family in ("construction", "training"):
        codes = [rule.code for rule in RULES if rule.__module__.split(".")[-2] == family]
        assert codes == sorted(codes)


def test_rules_ask_for_capabilities_not_for_each_others_codes():
    for path in RULES_DIR.glob("training/*.py"):
        assert not re.search(r'selected\("MF', path.read_text()), path.name
