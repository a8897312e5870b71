"""A checkpoint FSDP1 wrote resumes under the rewrite exactly as under FSDP1.

FSDP1's optimizer state dicts share one `step` tensor among the parameters of a flat parameter (27
parameters, 3 step tensors in this fixture). Loaded as they are into an FSDP2 model's AdamW, the shared
steps advance once per parameter and the resumed run drifts from its second step on; the rewrite's load
gives every parameter its own step (helpers/fsdp1_unshared_steps.py).
"""

import pytest
import torch

from migrate_fsdp.rewrite.api import rewrite_source
from tests.support import FIXTURES, step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

SCRIPT = FIXTURES / "train" / "resume" / "fsdp1.py"


def test_an_fsdp1_checkpoint_resumes_under_the_rewrite_as_under_fsdp1(tmp_path):
    rewritten = tmp_path / "rewritten.py"
    rewritten.write_bytes(rewrite_source(SCRIPT.read_bytes(), str(SCRIPT)).new_source)
    checkpoint = tmp_path / "fsdp1.pt"
    torchrun(SCRIPT, "--steps", "3", "--save", checkpoint)
    optimizer_state = torch.load(checkpoint, weights_only=True)["optimizer"]["state"]
    steps = {entry["step"].untyped_storage().data_ptr() for entry in optimizer_state.values()}
    assert len(steps) < len(optimizer_state)  # the case this guards: FSDP1 shares them
    fsdp1 = step_lines(torchrun(SCRIPT, "--steps", "3", "--resume", checkpoint).stdout)
    fsdp2 = step_lines(torchrun(rewritten, "--steps", "3", "--resume", checkpoint).stdout)
    assert len(fsdp1) == 3 and fsdp2 == fsdp1
