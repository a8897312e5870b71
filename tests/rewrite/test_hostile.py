"""Valid but hostile input to `rewrite`: code nested as deeply as CPython allows, and deeper."""

import subprocess
import sys

from migrate_fsdp.rewrite.api import rewrite_source

FSDP1_HEADER = "import torch.distributed.fsdp as fsdp\n\nmodel = fsdp.FullyShardedDataParallel(model)\n"


def chain(terms: int) -> str:
    return "total = " + " + ".join(f"parts[{i}]" for i in range(terms)) + "\n"


def test_a_long_generated_sum_is_rewritten():
    source = FSDP1_HEADER + chain(320)
    result = rewrite_source(source, "generated.py")
    assert result.diagnostics == []
    assert result.code == (
        "from torch.distributed.fsdp import fully_shard\nimport torch.distributed.fsdp as fsdp\n\n"
        "fully_shard(model)\n" + chain(320)
    )
    compile(result.code, "generated.py", "exec")
    assert rewrite_source(result.code, "generated.py").changed is False  # a fixed point


def test_the_command_and_its_workers_take_it(tmp_path):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(FSDP1_HEADER + chain(320))
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", "--jobs", "2", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MF002" not in done.stdout and "Rewrote 2 files" in done.stderr
    for name in ("a.py", "b.py"):
        assert "FullyShardedDataParallel" not in (tmp_path / name).read_text()


def test_nesting_python_refuses_is_a_parse_finding_not_a_crash(tmp_path):
    path = tmp_path / "deep.py"
    path.write_text(FSDP1_HEADER + "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n")
    before = path.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "migrate_fsdp", "rewrite", str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == f"{path}:1:1: MF001 nested deeper than Python compiles (too many nested parentheses); file skipped\n"
    assert path.read_bytes() == before
