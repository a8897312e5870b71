"""The proof: FSDP1 saves FULL, convert-ckpt converts, FSDP2 resumes with FSDP1's own losses and bit-exact state.

Runs the resume fixture (fixtures/train/resume) the way its fixture.json describes, on 2 gloo ranks.
"""

import json

import pytest
import torch

from tests.convert_ckpt.helpers import cli, same
from tests.support import FIXTURES, step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

RESUME = FIXTURES / "train" / "resume"


def _by_parameter(optimizer_state):
    """The optimizer state with param_groups keyed by FQN: FSDP1 and FSDP2 list a group's params in different orders."""
    groups = {
        fqn: {k: v for k, v in group.items() if k != "params"}
        for group in optimizer_state["param_groups"]
        for fqn in group["params"]
    }
    return {"state": optimizer_state["state"], "param_groups": groups}


def test_fsdp2_resumes_from_the_converted_fsdp1_checkpoint(tmp_path):
    fixture = json.loads((RESUME / "fixture.json").read_text())
    assert fixture["kind"] == "resume"
    fill = lambda args: [a.replace("{workdir}", str(tmp_path)) for a in args]  # noqa: E731
    script = lambda args: (RESUME / args[0], *fill(args[1:]))  # noqa: E731

    torchrun(*script(fixture["save"]))
    result = cli(*fill(fixture["convert"]), "--verify")
    assert result.exit_code == 0, result.output

    old = torchrun(*script(fixture["old"]), "--dump", tmp_path / "old.pt")
    new = torchrun(*script(fixture["new"]), "--dump", tmp_path / "new.pt")
    assert len(step_lines(old.stdout)) == 4
    assert step_lines(new.stdout) == step_lines(old.stdout)

    saved = torch.load(tmp_path / "full.pt", weights_only=True)
    old_state, new_state = (torch.load(tmp_path / f"{name}.pt", weights_only=True) for name in ("old", "new"))
    for run in (old_state, new_state):  # what each resumed from is the saved checkpoint, bit for bit
        model, optimizer = run["loaded"]
        assert same(dict(saved["model"]), dict(model)) == []
        assert same(_by_parameter(saved["optimizer"]), _by_parameter(optimizer)) == []
    old_model, old_optimizer = old_state["final"]
    new_model, new_optimizer = new_state["final"]
    assert same(dict(old_model), dict(new_model)) == []
    assert same(_by_parameter(old_optimizer), _by_parameter(new_optimizer)) == []
