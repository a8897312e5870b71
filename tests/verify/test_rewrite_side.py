"""The FSDP2 side made by our rewrite: the script's whole project, rewritten in a copy; refused when incomplete."""

import os

import pytest

from migrate_fsdp.verify.errors import VerifyError
from migrate_fsdp.verify.project import mirror, project_root
from migrate_fsdp.verify.rewrite_side import rewritten_side
from tests.verify.helpers import SCRIPTS

PROJECT = SCRIPTS / "project" / "fsdp1"
FSDP1_IMPORT = "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"


def write(root, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_project_is_the_package_root_or_the_scripts_directory(tmp_path):
    write(tmp_path, {"repo/pkg/__init__.py": "", "repo/pkg/recipes/__init__.py": "", "repo/pkg/recipes/train.py": "",
                     "repo/scripts/train.py": ""})
    assert project_root(tmp_path / "repo/pkg/recipes/train.py") == tmp_path / "repo"
    assert project_root(tmp_path / "repo/scripts/train.py") == tmp_path / "repo/scripts"
    assert project_root(tmp_path / "repo/scripts/train.py", tmp_path / "repo") == tmp_path / "repo"
    with pytest.raises(VerifyError, match="is not inside it"):
        project_root(tmp_path / "repo/scripts/train.py", tmp_path / "repo/pkg")


def test_the_copy_holds_the_code_and_links_the_rest(tmp_path):
    root = write(tmp_path / "proj", {"train.py": "x = 1\n", "conf/small.yaml": "lr: 1\n", "data/big.bin": "0",
                                     "lib/util.py": "", "lib/table.csv": "a\n", ".venv/pyvenv.cfg": ""})
    (root / "__pycache__").mkdir()
    mirror(root, tmp_path / "copy")
    copy = tmp_path / "copy"
    assert not (copy / "train.py").is_symlink() and (copy / "train.py").read_text() == "x = 1\n"
    assert not (copy / "lib").is_symlink() and not (copy / "lib/util.py").is_symlink()
    for linked in ("conf", "data", "lib/table.csv", ".venv"):
        assert (copy / linked).is_symlink() and os.path.samefile(copy / linked, root / linked)
    assert not (copy / "__pycache__").exists()


def test_every_module_of_the_project_is_rewritten_and_the_original_left_alone(tmp_path):
    before = {p.name: p.read_bytes() for p in PROJECT.iterdir()}
    rewritten_side(PROJECT / "train.py", PROJECT, [], tmp_path)  # a kept --logs directory: made again
    side = rewritten_side(PROJECT / "train.py", PROJECT, ["--steps", "2"], tmp_path)
    assert side.name == "new" and side.args == ["--steps", "2"]
    assert side.script == tmp_path / "rewrite" / "fsdp1" / "train.py"
    assert side.shown == f"rewrite of {PROJECT / 'train.py'}"
    for module, fsdp2 in (("modeling.py", "fully_shard("), ("checkpointing.py", "get_optimizer_state_dict(")):
        text = (side.script.parent / module).read_text()
        assert "FullyShardedDataParallel" not in text and fsdp2 in text, module
    assert {p.name: p.read_bytes() for p in PROJECT.iterdir()} == before


def test_unconverted_uses_refuse_in_one_short_line_with_the_users_path_and_the_next_step(tmp_path):
    root = write(tmp_path / ("project_" * 12), {
        "train.py": "import helpers\n",
        "helpers.py": FSDP1_IMPORT + "model = FSDP(model)\ninner = model._fsdp_wrapped_module\n"})
    with pytest.raises(VerifyError) as error:
        rewritten_side(root / "train.py", root, [], tmp_path / "work")
    message = str(error.value)
    # The wrapper attribute stays FSDP1, so its model's constructor stays with it: two uses, the constructor first.
    assert message.startswith("the rewrite leaves 2 FSDP1 uses unconverted (")
    assert "helpers.py:2:" in message and "MF003" in message and message.endswith("rerun with --new DIR")
    assert "\n" not in message and len(message) <= 200


def test_a_project_without_fsdp1_is_refused(tmp_path):
    root = write(tmp_path / "proj", {"train.py": "print(1)\n"})
    with pytest.raises(VerifyError, match="no FSDP1 code"):
        rewritten_side(root / "train.py", root, [], tmp_path / "work")


def test_the_real_engine_keeps_the_scripts_own_encoding(tmp_path):
    path = tmp_path / "proj" / "train.py"
    path.parent.mkdir()
    path.write_bytes(b"# -*- coding: latin-1 -*-\n" + FSDP1_IMPORT.encode() + b"name = '\xe9t\xe9'\nmodel = FSDP(model)\n")
    side = rewritten_side(path, path.parent, [], tmp_path / "work")
    assert side.script.read_bytes().decode("latin-1").endswith("name = '\xe9t\xe9'\nfully_shard(model)\n")


def test_source_that_is_not_text_is_refused_in_one_line(tmp_path):
    path = tmp_path / "proj" / "train.py"
    path.parent.mkdir()
    path.write_bytes(FSDP1_IMPORT.encode() + b"name = '\xe9'\n")
    with pytest.raises(VerifyError, match="MF001 cannot decode as utf-8") as error:
        rewritten_side(path, path.parent, [], tmp_path / "work")
    assert "\n" not in str(error.value)
