"""The bundled fixture suite: what it holds and how a fixture directory is read."""

import json

import pytest

from migrate_fsdp.verify import suite
from migrate_fsdp.verify.errors import VerifyError
from tests.verify.helpers import TRAIN

REQUIRED = {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "mixed_precision", "grad_accum",
            "bf16_grad_accum", "size_based", "module_wrap", "clip_grad", "resume"}


def test_the_suite_covers_every_setting_of_the_issue():
    fixtures = suite.discover()
    assert {f.name for f in fixtures} >= REQUIRED
    for fixture in fixtures:
        if fixture.name in REQUIRED:
            assert (fixture.directory / "fsdp2.py").is_file(), fixture.name
    assert {f.name for f in fixtures if f.kind == "resume"} >= {"resume"}


def test_resume_fixtures_name_every_step():
    for fixture in (f for f in suite.discover() if f.kind == "resume"):
        assert {"save", "convert", "old", "new"} <= set(fixture.spec)


def test_fixture_json_is_read_and_bad_json_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "fsdp1.py").write_text("")
    (tmp_path / "a" / "fixture.json").write_text(json.dumps({"args": ["--lr", "1"]}))
    (tmp_path / "not_a_fixture").mkdir()
    [fixture] = suite.discover(tmp_path)
    assert fixture.spec == {"args": ["--lr", "1"]} and fixture.kind == "pair"
    (tmp_path / "a" / "fixture.json").write_text("{")
    with pytest.raises(VerifyError, match="fixture.json: not valid JSON"):
        suite.discover(tmp_path)


def test_select_keeps_order_and_refuses_unknown_names():
    fixtures = suite.discover(TRAIN)
    assert [f.name for f in suite.select(fixtures, ("no_shard", "full_shard"))] == ["no_shard", "full_shard"]
    with pytest.raises(VerifyError, match="no fixture named nope"):
        suite.select(fixtures, ("nope",))
