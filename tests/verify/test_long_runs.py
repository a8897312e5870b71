"""200 steps of bf16 + gradient accumulation + active clipping: the verdict holds over a long run.

The correct FSDP2 migration passes (judged against the control run from step
EARLY_STEPS on); a learning rate 1% off and a wrong reduce dtype fail.
"""

import json

import pytest

from migrate_fsdp.verify import envelope
from tests.verify.helpers import SCRIPTS, verify

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks), three runs per test

LONG = SCRIPTS / "long_bf16"


def _checks(report) -> tuple:
    [pair] = json.loads(report.read_text())["pairs"]
    return pair, {c["name"]: c for c in pair["checks"]}


def _wrong(tmp_path, name: str, old: str, new: str, of: str = "fsdp2.py"):
    source = (LONG / of).read_text()
    assert source.count(old) == 1
    script = tmp_path / name
    script.write_text(source.replace(old, new))
    return script


def test_the_correct_migration_passes_200_steps_against_the_control(tmp_path):
    report, saved = tmp_path / "report.json", tmp_path / "state.pt"
    done = verify(LONG / "fsdp1.py", "--new", LONG / "fsdp2.py", "--report", report, "--logs", tmp_path / "logs",
                  "--", "--save", saved)
    assert done.returncode == 0, done.stdout + done.stderr
    pair, checks = _checks(report)
    assert set(pair["runs"]) == {"old", "new", "control"}
    # Each side's file kept apart; the new version's back where it saved it; judged by the control's gaps.
    assert saved.is_file() and list((tmp_path / "logs" / "control" / "saved").iterdir())
    assert checks["checkpoints"]["passed"] and "of its tolerance at most" in checks["checkpoints"]["summary"]
    assert pair["runs"]["control"]["ranks"][0]["steps"] == 200
    assert not pair["setting"]["exact"]
    assert checks["clip norm"]["passed"]  # step 0 counts the bf16 accumulation (it failed at 1.8e-5 > 1.9e-6)
    assert checks["drift"]["passed"] and checks["param norm"]["passed"]
    late = [row for row in pair["per_step"] if row["rank"] == 0 and row["step"] >= envelope.EARLY_STEPS]
    assert len({row["norm_rtol"] for row in late}) == 1  # the control's envelope, not a bound growing per step


def test_a_learning_rate_one_percent_off_fails(tmp_path):
    wrong = _wrong(tmp_path, "lr.py", "lr=1e-2", "lr=1.01e-2")
    report = tmp_path / "report.json"
    done = verify(LONG / "fsdp1.py", "--new", wrong, "--report", report)
    assert done.returncode == 1, done.stdout + done.stderr
    _, checks = _checks(report)
    assert checks["sharded modules"]["passed"] and checks["gradient sync"]["passed"]
    assert not checks["param norm"]["passed"]
    assert not checks["drift"]["passed"] and "param norm" in checks["drift"]["summary"]


@pytest.mark.parametrize("wrong_side", ["new", "old"])
def test_a_reduce_dtype_other_than_the_old_versions_fails(tmp_path, wrong_side):
    """bf16 where FSDP1 reduced in fp32, or the reverse: only the units' settings tell (at world size 2 a bf16
    reduction rounds no more than the accumulation already does)."""
    of = "fsdp2.py" if wrong_side == "new" else "fsdp1.py"
    wrong = _wrong(tmp_path, of, "reduce_dtype=torch.float32", "reduce_dtype=torch.bfloat16", of=of)
    old, new = (LONG / "fsdp1.py", wrong) if wrong_side == "new" else (wrong, LONG / "fsdp2.py")
    report = tmp_path / "report.json"
    done = verify(old, "--new", new, "--steps", "12", "--report", report)
    assert done.returncode == 1, done.stdout + done.stderr
    _, checks = _checks(report)
    dtypes = ("float32", "bfloat16") if wrong_side == "new" else ("bfloat16", "float32")
    assert "reduce_dtype {} (old) vs {} (new)".format(*dtypes) in checks["sharded modules"]["summary"]
