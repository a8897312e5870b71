"""The FSDP2 side made by our rewrite: written to a temporary place, refused when the rewrite is incomplete."""

import sys
import types
from dataclasses import dataclass, field

import pytest

from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.rewrite_side import rewritten_side


@dataclass
class Result:
    new_source: bytes
    changed: bool = True
    diagnostics: list = field(default_factory=list)


class Diag:
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


@pytest.fixture
def engine(monkeypatch):
    """A stand-in for migrate_fsdp.rewrite.api with a result the test chooses."""
    module = types.ModuleType("migrate_fsdp.rewrite.api")
    module.result = None
    module.rewrite_source = lambda source, path: module.result
    monkeypatch.setitem(sys.modules, "migrate_fsdp.rewrite.api", module)
    return module


def script(tmp_path):
    path = tmp_path / "src" / "train.py"
    path.parent.mkdir()
    path.write_text("model = FSDP(model)\r\n", newline="")
    return path


def test_rewrite_goes_to_the_workdir_and_runs_beside_the_original(tmp_path, engine):
    engine.result = Result(b"model = fully_shard(model)\r\n")
    side = rewritten_side(script(tmp_path), ["--lr", "1"], tmp_path / "work")
    assert side.name == "new" and side.args == ["--lr", "1"]
    assert side.script == tmp_path / "work" / "rewrite" / "train.py"
    assert side.script.read_bytes() == b"model = fully_shard(model)\r\n"
    assert side.sys_path == tmp_path / "src"


def test_unconverted_uses_refuse_the_run_and_are_listed(tmp_path, engine):
    engine.result = Result(b"x", diagnostics=[Diag("train.py:3:1: MF001 a"), Diag("train.py:9:5: MF002 b")])
    with pytest.raises(VerifyError) as error:
        rewritten_side(script(tmp_path), [], tmp_path / "work")
    message = str(error.value)
    assert "2 FSDP1 use(s)" in message and "train.py:3:1: MF001 a; train.py:9:5: MF002 b" in message
    assert "\n" not in message
    assert not (tmp_path / "work").exists()


def test_a_script_without_fsdp1_is_refused(tmp_path, engine):
    engine.result = Result(b"x", changed=False)
    with pytest.raises(VerifyError, match="no FSDP1 code"):
        rewritten_side(script(tmp_path), [], tmp_path / "work")


def test_the_real_engine_keeps_the_scripts_own_encoding(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"# -*- coding: latin-1 -*-\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
                     b"name = '\xe9t\xe9'\nmodel = FSDP(model)\n")
    side = rewritten_side(path, [], tmp_path / "work")
    assert side.script.read_bytes().decode("latin-1").endswith("name = '\xe9t\xe9'\nfully_shard(model)\n")


def test_source_that_is_not_text_is_refused_in_one_line(tmp_path):
    path = tmp_path / "train.py"
    path.write_bytes(b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nname = '\xe9'\n")
    with pytest.raises(VerifyError, match="MF001 cannot decode as utf-8") as error:
        rewritten_side(path, [], tmp_path / "work")
    assert "\n" not in str(error.value)
