"""MF214 on 2 gloo ranks: an EMA teacher run only under no_grad, updated from an FSDP student, after the rewrite.

FSDP2 leaves such a teacher's parameters unsharded (no backward reshards them): without `fsdp2_reshard` the
update crashes mixing Tensor and DTensor. With it the teacher must follow the same EMA as a single process
computes with plain modules (every rank sees the same batch, so the student trains as one process would).
"""

import subprocess
import sys
import textwrap

import pytest

from migrate_fsdp.rewrite.api import rewrite_source
from migrate_fsdp.rewrite.selection import Selection
from tests.support import step_lines, torchrun

pytestmark = pytest.mark.slow  # launches torchrun (2 gloo ranks)

PROGRAM = textwrap.dedent(
    '''
    import sys

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy


    def make_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))


    @torch.no_grad()
    def update_teacher(student, teacher, momentum):
        for ps, pt in zip(student.parameters(), teacher.parameters()):
            pt.mul_(momentum).add_(ps, alpha=1 - momentum)


    def main():
        distributed = sys.argv[1] == "fsdp"
        if distributed:
            dist.init_process_group("gloo")
            strategy = ShardingStrategy[sys.argv[2]]
            student = FSDP(make_model(), sharding_strategy=strategy, device_id=torch.device("cpu"))
            teacher = FSDP(make_model(), sharding_strategy=strategy, device_id=torch.device("cpu"))
        else:
            student, teacher = make_model(), make_model()
        optimizer = torch.optim.SGD(student.parameters(), lr=0.5)
        batch = torch.linspace(-1, 1, 8).reshape(2, 4)
        for step in range(4):
            with torch.no_grad():
                target = teacher(batch)
            loss = ((student(batch) - target) ** 2).sum() + student(batch).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            update_teacher(student, teacher, 0.5)
            if not distributed or dist.get_rank() == 0:
                print(f"step {step} teacher {target.sum().item():.6f}")
        if distributed:
            dist.destroy_process_group()


    if __name__ == "__main__":
        main()
    '''
)


LOOP_UPDATE = """
    for ps, pt in zip(student.parameters(), teacher.parameters()):
        pt.mul_(momentum).add_(ps, alpha=1 - momentum)
"""
# the lists collected by comprehensions, as timm's ModelEmaV3 does
FOREACH_UPDATE = """
    teacher_params = [p for p in teacher.parameters()]
    student_params = [p.detach() for p in student.parameters()]
    torch._foreach_lerp_(teacher_params, student_params, 1 - momentum)
"""


@pytest.mark.parametrize(
    "strategy, update", [("FULL_SHARD", LOOP_UPDATE), ("SHARD_GRAD_OP", LOOP_UPDATE), ("FULL_SHARD", FOREACH_UPDATE)]
)
def test_an_ema_teacher_follows_its_updates_as_a_single_process_computes(strategy, update, tmp_path):
    program = PROGRAM.replace(LOOP_UPDATE, update)
    result = rewrite_source(program, "ema.py", Selection.from_prefixes(None, None))
    rewritten = result.new_source.decode()
    assert not result.diagnostics and "fsdp2_reshard(teacher)" in rewritten
    script = tmp_path / "ema.py"
    script.write_text(rewritten)
    reference = tmp_path / "reference.py"
    reference.write_text(program)
    single = subprocess.run([sys.executable, str(reference), "single"], capture_output=True, text=True, check=True)
    expected = step_lines(single.stdout)
    assert len(expected) == 4 and len(set(line.split()[3] for line in expected)) > 1  # the teacher does change
    assert step_lines(torchrun(script, "fsdp", strategy).stdout) == expected
