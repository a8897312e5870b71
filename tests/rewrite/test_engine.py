"""The engine's services to rules, exercised with small rules defined here.

Real rules are tested through whole-file fixtures; these tests pin down what
every rule relies on: statement insertion, helpers, imports, TODOs, errors.
"""

import textwrap

import libcst as cst
import pytest

from migrate_fsdp.rewrite import selection as selection_module
from migrate_fsdp.rewrite.api import rewrite_source
from migrate_fsdp.rewrite.rule import Rule
from migrate_fsdp.rewrite.selection import Selection

FSDP = "torch.distributed.fsdp.FullyShardedDataParallel"


class WrapToFullyShard(Rule):
    """`FSDP(m)` -> `fully_shard(m)`, plus a statement before and after and a helper."""

    code = "MF991"
    name = "test-wrap"
    summary = "test rule"

    def leave_Call(self, original, updated):
        if not self.ctx.matches(original.func, FSDP):
            return updated
        self.ctx.mark_handled(original.func)
        local = self.ctx.require_import("torch.distributed.fsdp", "fully_shard")
        if self.ctx.can_insert_statements():
            helper = self.ctx.add_helper("_fsdp1_forward_prefetch")
            self.ctx.insert_before([cst.parse_statement(f"{helper}('before')")])
            self.ctx.insert_after([cst.parse_statement(f"{helper}('after')")])
        return updated.with_changes(func=cst.Name(local))


class ReportNoSync(Rule):
    code = "MF992"
    name = "test-report"
    summary = "test rule"
    tokens = (b".no_sync(",)

    def leave_Call(self, original, updated):
        if isinstance(original.func, cst.Attribute) and original.func.attr.value == "no_sync":
            self.ctx.report(original, self.code, "receiver type unknown")
        return updated


class Broken(Rule):
    code = "MF993"
    name = "test-broken"
    summary = "test rule"

    def leave_Module(self, original, updated):
        raise RuntimeError("boom")


@pytest.fixture
def rules(monkeypatch):
    def use(*rule_classes):
        monkeypatch.setattr(selection_module, "RULES", list(rule_classes))
        return Selection.from_prefixes(None, None)

    return use


def run(source, selection, todo=True):
    return rewrite_source(textwrap.dedent(source), "m.py", selection, todo)


def test_insertions_helpers_and_imports(rules):
    result = run(
        '''\
        """Docstring."""
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        # build it
        model = FSDP(torch.nn.Linear(2, 2))
        other = FSDP(torch.nn.Linear(2, 2))
        ''',
        rules(WrapToFullyShard),
    )
    head, helper = result.code.split("\n\n\n", 1)
    helper, body = helper.rsplit("\n\n\n", 1)
    assert head == '"""Docstring."""\nimport torch\nfrom torch.distributed.fsdp import FSDPModule, fully_shard'
    assert helper.startswith("def _fsdp1_forward_prefetch(root):\n") and "\n\n\n" not in helper  # once
    assert body == textwrap.dedent(
        """\
        # build it
        _fsdp1_forward_prefetch('before')
        model = fully_shard(torch.nn.Linear(2, 2))
        _fsdp1_forward_prefetch('after')
        _fsdp1_forward_prefetch('before')
        other = fully_shard(torch.nn.Linear(2, 2))
        _fsdp1_forward_prefetch('after')
        """
    )
    assert result.diagnostics == []


class AskTwiceUseOnce(Rule):
    """Asks for two helpers at each call, then writes only the first: the other must not reach the file."""

    code = "MF994"
    name = "test-helpers"
    summary = "test rule"

    def leave_Call(self, original, updated):
        if not self.ctx.matches(original.func, FSDP):
            return updated
        self.ctx.mark_handled(original.func)
        self.ctx.add_helper("fsdp2_load_state_dict")  # a path another rule would have replaced
        used = self.ctx.add_helper("fsdp2_set_optimizer_state_dict")
        return cst.Call(cst.Name(used), updated.args)


def test_only_helpers_the_code_names_are_written_with_those_they_name(rules):
    result = run(
        """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        FSDP(model, optim, state)
        """,
        rules(AskTwiceUseOnce),
    )
    defined = [line.split("(")[0] for line in result.code.splitlines() if line.startswith("def ")]
    # the one written, and the two it calls; not the helper asked for and never named
    assert sorted(defined) == ["def fsdp1_unshared_steps", "def fsdp2_reshard", "def fsdp2_set_optimizer_state_dict"]


def test_import_merges_into_existing_parenthesised_import(rules):
    result = run(
        """\
        from torch.distributed.fsdp import (
            FullyShardedDataParallel as FSDP,
            MixedPrecisionPolicy,
        )

        f = lambda m: FSDP(m)
        """,
        rules(WrapToFullyShard),
    )
    assert result.code == textwrap.dedent(
        """\
        from torch.distributed.fsdp import (
            MixedPrecisionPolicy,
            fully_shard,
        )

        f = lambda m: fully_shard(m)
        """
    )


def test_taken_name_gets_an_alias_and_unconverted_use_keeps_its_import(rules):
    result = run(
        """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def fully_shard():
            pass

        m = FSDP(net)
        t = FSDP
        """,
        rules(WrapToFullyShard),
    )
    assert "    FullyShardedDataParallel as FSDP,\n    fully_shard as fsdp2_fully_shard,\n)" in result.code
    assert "m = fsdp2_fully_shard(net)" in result.code
    assert [d.code for d in result.diagnostics] == ["MF900"]


def test_function_level_import_removed_and_block_kept_valid(rules):
    result = run(
        """\
        def setup(net):
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            return (lambda: FSDP(net))()
        """,
        rules(WrapToFullyShard),
    )
    assert result.code == textwrap.dedent(
        """\
        from torch.distributed.fsdp import fully_shard
        def setup(net):
            return (lambda: fully_shard(net))()
        """
    )


def test_reexported_name_keeps_its_import(rules):
    source = """\
        from torch.distributed.fsdp import ShardingStrategy

        __all__ = ["ShardingStrategy"]
        """
    result = run(source, rules(), todo=False)
    assert result.code == textwrap.dedent(source)


def test_todo_goes_above_the_innermost_statement_once(rules):
    source = """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        def step(model):
            if ready:
                with model.no_sync():  # accumulate
                    loss.backward()
        """
    first = run(source, rules(ReportNoSync))
    assert "        # TODO(migrate-fsdp): MF992\n        with model.no_sync():  # accumulate" in first.code
    second = rewrite_source(first.new_source, "m.py", rules(ReportNoSync))
    assert second.code == first.code
    assert [str(d) for d in second.diagnostics] == ["m.py:4:14: MF992 receiver type unknown"]  # the unused FSDP1 import went, and its blank line


def test_rule_tokens_make_files_without_fsdp_worth_parsing(rules):
    result = run("with model.no_sync():\n    pass\n", rules(ReportNoSync), todo=False)
    assert [d.code for d in result.diagnostics] == ["MF992"]


def test_no_statement_insertion_in_a_one_line_suite(rules):
    result = run(
        """\
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        if wrap: model = FSDP(net)
        """,
        rules(WrapToFullyShard),
    )
    assert "if wrap: model = fully_shard(net)\n" in result.code
    assert "_announce" not in result.code


def test_internal_error_leaves_file_unchanged(rules):
    source = "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nm = FSDP(net)\n"
    result = run(source, rules(Broken))
    assert not result.changed
    assert result.failed
    assert [d.code for d in result.diagnostics] == ["MF002"]
    assert "RuntimeError: boom" in result.diagnostics[0].message


def test_fsdp1_import_nobody_used_is_dropped_only_when_something_changed(rules):
    source = "import torch\nfrom torch.distributed.fsdp import BackwardPrefetch, fully_shard\nfully_shard(m)\n"
    assert run(source, rules()).code == textwrap.dedent(source)  # nothing to convert: byte-identical


def test_a_token_group_makes_a_file_worth_parsing_only_where_all_of_it_appears():
    from migrate_fsdp.rewrite.api import worth_parsing
    from migrate_fsdp.rewrite.selection import Selection

    ema = b"with torch.no_grad():\n    for p, q in zip(a.parameters(), b.parameters()):\n        q.mul_(0.9)\n"
    selection = Selection.from_prefixes(["MF214"], None)
    assert worth_parsing(ema, selection)
    assert not worth_parsing(b"x.mul_(2)\n", selection)  # an in-place multiplication alone
    assert not worth_parsing(ema.replace(b"no_grad", b"enable_grad"), selection)
