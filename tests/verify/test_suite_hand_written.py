"""Every bundled fixture pair, FSDP1 against its hand-written FSDP2 version, must pass verify on 2 gloo ranks.

Also pins the setting verify detects for each: bit-exact unless the fixture is
one of the documented, explained exceptions.
"""

import json

import pytest

from migrate_fsdp.verify import suite
from tests.verify.helpers import verify

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

TOLERANCED = {"bf16_grad_accum": "accumulation", "clip_grad": "clipping"}
FIXTURES = [f.name for f in suite.discover() if (f.directory / "fsdp2.py").is_file()]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_pair_passes(name, tmp_path):
    report, plot = tmp_path / "report.json", tmp_path / "plot.png"
    done = verify("--fixture", name, "--hand-written", "--report", report, "--plot", plot)
    assert done.returncode == 0, done.stdout + done.stderr
    [pair] = json.loads(report.read_text())["pairs"]
    assert pair["status"] == "pass" and all(c["passed"] for c in pair["checks"])
    old, new = pair["runs"]["old"]["optimizers"], pair["runs"]["new"]["optimizers"]
    assert [o["units"].keys() for o in old] == [n["units"].keys() for n in new]
    eps = pair["setting"]["eps"]
    if name in TOLERANCED:
        assert not pair["setting"]["exact"]
        assert eps[TOLERANCED[name]], eps
    else:
        assert pair["setting"]["exact"], pair["setting"]
        assert {"gradient bits", "parameter bits"} <= {c["name"] for c in pair["checks"]}
    assert all(m["old_peak"] > 0 and m["new_peak"] > 0 for m in pair["memory"])
    assert plot.read_bytes()[:4] == b"\x89PNG"
