"""verify on a project: a script whose wrapping and checkpointing live in sibling modules (tests/verify/scripts/project).

The script trains 5 steps and saves a checkpoint after its loop; verify runs it to its end with no flags.
"""

import shutil

import pytest

from tests.verify.helpers import SCRIPTS, verify

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

OLD = SCRIPTS / "project" / "fsdp1" / "train.py"
HAND_WRITTEN = SCRIPTS / "project" / "fsdp2"


def test_the_whole_project_is_rewritten_and_passes(tmp_path):
    done = verify(OLD, "--", "--save", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[ok] steps: 5 optimizer steps" in done.stdout
    assert "[ok] sharded modules: 3 FSDP units" in done.stdout  # the root owns no parameters
    assert "[ok] checkpoints: 1 saved file(s) compared by FQN, model and optimizer state bit-identical" in done.stdout
    assert (tmp_path / "last.pt").is_file()  # the new version's checkpoint stays where it saved it


def test_the_hand_written_fsdp2_project_passes_with_new_dir(tmp_path):
    done = verify(OLD, "--new", HAND_WRITTEN, "--", "--save", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_migration_of_a_sibling_module_fails(tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(HAND_WRITTEN, wrong)
    modeling = wrong / "modeling.py"
    modeling.write_text(modeling.read_text().replace("(model[0], model[2])", "(model[0],)"))
    done = verify(OLD, "--new", wrong, "--", "--save", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[FAIL] sharded modules: not sharded by the new version: 2" in done.stdout


def test_a_wrong_migration_of_the_checkpoint_fails(tmp_path):
    wrong = tmp_path / "wrong"
    shutil.copytree(HAND_WRITTEN, wrong)
    saving = wrong / "checkpointing.py"
    saving.write_text(saving.read_text().replace('"optimizer": get_optimizer_state_dict', '"optim": get_optimizer_state_dict'))
    saving.write_text(saving.read_text().replace("full_state_dict=True, cpu_offload=True", "cpu_offload=True"))
    done = verify(OLD, "--new", wrong, "--", "--save", tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[FAIL] checkpoints: " in done.stdout
