"""A function no code of the program names holds no model back; one named anywhere, or reachable unnamed, does.

The model here also goes to a library out of the program's sight, which may call any function of the program
that it can reach: one the program never names it cannot."""

import pytest

from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

TRAIN = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from pkg.ckpt import save
from trainer_library import Trainer


def main(module):
    model = FSDP(module, device_id=torch.device("cpu"))
    save(model)
    Trainer(model).fit()  # out of the program's sight: it may call any function of the program
'''

CKPT = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save(model):
    torch.save(model, "m.pt")  # pickles the module: no FSDP1 read (its state dict would hold the model FSDP1)

%s
def load_local(model):
    with FSDP.summon_full_params(model):
        model.load_state_dict(torch.load("full.pt"))
'''

INIT = b'''from pkg.ckpt import load_local, save

__all__ = ["load_local", "save"]
'''


def _rewrite(files: dict[str, bytes]) -> dict[str, str]:
    selection = Selection.from_prefixes(None, None)
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()])
    return {result.path: result.new_source.decode() for result in results}


def _constructor_converts(files) -> bool:
    return "fully_shard(module" in _rewrite(files)["pkg/train.py"]


@pytest.mark.parametrize("decorator", [b"", b"@torch.no_grad()\n"], ids=["plain", "under_no_grad"])
def test_a_function_only_exported_holds_nothing_back(decorator):
    ckpt = (CKPT % b"").replace(b"\ndef load_local", b"\n" + decorator + b"def load_local")
    files = {"pkg/__init__.py": INIT, "pkg/train.py": TRAIN, "pkg/ckpt.py": ckpt}
    out = _rewrite(files)
    assert "fully_shard(module" in out["pkg/train.py"]
    assert "FSDP.summon_full_params(model)" in out["pkg/ckpt.py"]


@pytest.mark.parametrize(
    "elsewhere",
    [
        b"from pkg.ckpt import load_local\nload_local(None)\n",  # called
        b"from pkg import ckpt\nhook = getattr(ckpt, 'load_local')\n",  # named in a string
        b"from pkg.ckpt import load_local as restore\n",  # imported under another name
    ],
    ids=["called", "string", "aliased"],
)
def test_a_function_named_anywhere_holds_its_models_back(elsewhere):
    files = {"pkg/__init__.py": INIT, "pkg/train.py": TRAIN, "pkg/ckpt.py": CKPT % b"", "scripts/run.py": elsewhere}
    assert not _constructor_converts(files)


def test_a_test_function_pytest_collects_holds_its_models_back():
    ckpt = CKPT.replace(b"def load_local", b"def test_load_local")
    files = {"pkg/__init__.py": b"", "pkg/train.py": TRAIN, "pkg/ckpt.py": ckpt % b""}
    assert not _constructor_converts(files)


@pytest.mark.parametrize(
    "decorator", [b"@register\n", b"class Hooks(Callback):\n    @staticmethod\n"], ids=["decorated", "method_of_a_based_class"]
)
def test_a_function_reachable_without_its_name_holds_its_models_back(decorator):
    ckpt = CKPT.replace(b"\ndef load_local", b"\n" + decorator + b"def load_local")
    if b"class" in decorator:
        ckpt = ckpt.replace(b"def load_local(model):\n    with", b"def load_local(model):\n        with").replace(
            b"\n        model.load_state_dict", b"\n            model.load_state_dict"
        )
        ckpt = ckpt.replace(b"@staticmethod\ndef", b"@staticmethod\n    def")
    files = {"pkg/__init__.py": b"", "pkg/train.py": TRAIN, "pkg/ckpt.py": ckpt % b"register = Callback = object\n"}
    assert not _constructor_converts(files)


ENTRY = b'''import copy
import functools

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def build_wrapper():
    return functools.partial(FSDP, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"))


def main():
    model = build_wrapper()(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    model(torch.randn(4, 8)).sum().backward()
    with FSDP.summon_full_params(model):
        return copy.deepcopy(model)
'''


def test_an_entry_point_nobody_names_still_meets_the_models_it_builds_itself():
    """`main()` run as a console script: never named, but its model comes from a factory, not a parameter: the
    FSDP1 code there that stays holds it back."""
    ddp = b"from torch.nn.parallel import DistributedDataParallel\n\n\ndef wrap(m):\n    return DistributedDataParallel(m)\n"
    files = [ParsedFile(data, path, Selection.from_prefixes(None, None), True) for path, data in (("train.py", ENTRY), ("ddp.py", ddp))]
    out = rewrite_program(files)[0].new_source
    assert b"fully_shard" not in out and b"with FSDP.summon_full_params(model):" in out
