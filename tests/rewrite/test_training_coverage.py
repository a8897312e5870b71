"""docs/coverage.md names every public FSDP1 API of the installed torch, each with a rewrite or a code.

The public surface is read from torch itself: the `FullyShardedDataParallel`
class (its own methods and the nn.Module methods it overrides), the public
attributes an instance sets (from a real one-rank instance, built in a child
process), the constructor's arguments, the FSDP1 names of
`torch.distributed.fsdp.__all__` and of `torch.distributed.fsdp.wrap`, and
`ShardedGradScaler`.
"""

import inspect
import re
import subprocess
import sys
import textwrap

import pytest
import torch.distributed.fsdp as fsdp
import torch.distributed.fsdp.wrap as fsdp_wrap
import torch.nn as nn

from migrate_fsdp.rewrite.names import FSDP2_EXPORTS
from migrate_fsdp.rewrite.selection import all_codes
from tests.support import REPO

COVERAGE = REPO / "docs" / "coverage.md"
FSDP = fsdp.FullyShardedDataParallel
_ROW = re.compile(r"^\|(?P<api>[^|]*)\|(?P<rewrite>[^|]*)\|(?P<code>[^|]*)\|")


def rows() -> list[dict]:
    found = []
    for line in COVERAGE.read_text().splitlines():
        match = _ROW.match(line)
        if match and not set(match["api"].strip()) <= {"-"} and match["api"].strip() != "FSDP1":
            found.append({key: value.strip() for key, value in match.groupdict().items()})
    return found


def covered() -> set[str]:
    """Every API named in the first column of a row that has a rewrite or a code."""
    names = set()
    for row in rows():
        if row["rewrite"] or row["code"]:
            names.update(re.findall(r"`([^`]+)`", row["api"]))
    return names


def instance_attributes() -> set[str]:
    child = textwrap.dedent(
        """\
        import sys, tempfile, torch, torch.distributed as dist, torch.nn as nn
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        with tempfile.TemporaryDirectory() as store:
            dist.init_process_group("gloo", init_method=f"file://{store}/pg", rank=0, world_size=1)
            model = FSDP(nn.Linear(2, 2), device_id=torch.device("cpu"))
            print(" ".join(name for name in vars(model) if not name.startswith("_")))
            dist.destroy_process_group()
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(done.stdout.split()) - set(vars(nn.Module()))


def fsdp_members() -> set[str]:
    own = {name for name in vars(FSDP) if not name.startswith("_")}
    return own | {name for name in dir(FSDP) if not name.startswith("_") and name not in dir(nn.Module)}


def test_every_public_name_of_the_fsdp_class_is_covered():
    documented = covered()
    members = fsdp_members() | instance_attributes()
    missing = sorted(name for name in members if f"FullyShardedDataParallel.{name}" not in documented)
    assert not missing, f"docs/coverage.md lacks a rewrite or a code for FullyShardedDataParallel.{missing}"


def test_every_constructor_argument_is_covered():
    documented = " ".join(covered())
    arguments = [name for name in inspect.signature(FSDP.__init__).parameters if name != "self"]
    missing = [name for name in arguments if f"FullyShardedDataParallel({name}=" not in documented]
    assert not missing, f"docs/coverage.md lacks FullyShardedDataParallel({missing}=...)"


@pytest.mark.parametrize(
    "module, names",
    [
        ("torch.distributed.fsdp", sorted(set(fsdp.__all__) - FSDP2_EXPORTS)),
        ("torch.distributed.fsdp.wrap", sorted(fsdp_wrap.__all__)),
        ("torch.distributed.fsdp.sharded_grad_scaler", ["ShardedGradScaler"]),
    ],
)
def test_every_public_fsdp1_name_is_covered(module, names):
    documented = covered()
    missing = [name for name in names if f"{module}.{name}" not in documented]
    assert not missing, f"docs/coverage.md lacks {module}.{missing}"


def test_codes_in_the_table_exist():
    codes = set(all_codes())
    for row in rows():
        for code in re.findall(r"MF\d{3}", row["code"]):
            assert code in codes, row
