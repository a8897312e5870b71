"""End-to-end comparisons that must fail, and the resume mechanism, with real 2-rank gloo runs."""

import json
import shutil

import pytest

from migrate_fsdp.verify import suite
from migrate_fsdp.verify.placement import plan
from tests.verify.helpers import SCRIPTS, TRAIN, launch, verify

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)


def test_a_different_precision_fails_parity_from_the_first_step(tmp_path):
    report = tmp_path / "report.json"
    done = verify(TRAIN / "mixed_precision" / "fsdp1.py", "--new", TRAIN / "full_shard" / "fsdp2.py",
                  "--steps", "3", "--report", report)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("verdict: FAIL (parity)")
    checks = {c["name"]: c for c in json.loads(report.read_text())["pairs"][0]["checks"]}
    assert "param_dtype bfloat16 (old) vs float32 (new)" in checks["sharded modules"]["summary"]
    assert not checks["loss"]["passed"] and checks["loss"]["worst"]["step"] == 0


def test_a_wrong_wrapping_is_caught_although_the_losses_agree(tmp_path):
    source = (TRAIN / "full_shard" / "fsdp2.py").read_text()
    loop = """    for module in model.modules():
        if isinstance(module, nn.TransformerEncoderLayer):
            fully_shard(module, mesh=mesh)
"""
    assert loop in source
    root_only = tmp_path / "root_only.py"
    root_only.write_text(source.replace(loop, ""))
    report = tmp_path / "report.json"
    done = verify(TRAIN / "full_shard" / "fsdp1.py", "--new", root_only, "--steps", "3", "--report", report)
    assert done.returncode == 1, done.stdout + done.stderr
    checks = {c["name"]: c for c in json.loads(report.read_text())["pairs"][0]["checks"]}
    assert checks["sharded modules"]["summary"] == "not sharded by the new version: layers.0, layers.1"
    assert checks["loss"]["passed"] and checks["loss"]["summary"] == "6 compared, all identical"


def test_resume_mechanism_reports_a_failing_conversion(tmp_path):
    fixture_dir = tmp_path / "fixtures" / "resume_like"
    fixture_dir.mkdir(parents=True)
    for name in ("fsdp1.py", "fsdp2.py"):
        shutil.copy(SCRIPTS / "faulty.py", fixture_dir / name)
    # The save step saves nothing and needs no process group: gloo's teardown at exit aborts now and then
    # (SIGABRT, "terminate called without an active exception"), which would fail this test at the wrong step.
    (fixture_dir / "save.py").write_text("print('saved nothing')\n")
    (fixture_dir / "fixture.json").write_text(json.dumps({
        "kind": "resume",
        "save": ["save.py"],
        "convert": ["{workdir}/never-saved.pt", "{workdir}/dcp"],
        "old": ["fsdp1.py", "--fault", "short"],
        "new": ["fsdp2.py", "--fault", "short"],
    }))
    [fixture] = suite.discover(fixture_dir.parent)
    outcome = suite.run_fixture(fixture, launch(), plan("cpu", 2, [], standalone=True), tmp_path / "work", hand_written=False)
    assert outcome.status == "error"
    [failure] = outcome.failures
    assert failure.side == "convert", f"{failure.message}\n{failure.tail}"
    assert failure.message.startswith(f"migrate-fsdp convert-ckpt {tmp_path}/work/scratch/never-saved.pt ")
    assert "failed (exit" in failure.message and failure.tail
    assert [run.side.name for run in outcome.runs] == ["save"]
