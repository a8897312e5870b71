"""FSDP1 settings defined apart from their constructors (MF112, analysis/value_flow.py): they take their FSDP2
form where they are defined only when every place their value reaches is a constructor that converts."""

import libcst as cst
import pytest

from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls
from migrate_fsdp.rewrite.analysis.value_flow import Sink, ValueFlow
from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

POLICIES = b'''import functools

import torch
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

bf16 = MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)


def get_policies(cfg):
    mp = None
    if cfg.mixed_precision:
        mp = bf16
    wrapping = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={torch.nn.Linear})
    return mp, wrapping
'''

TRAIN = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from pkg.policies import get_policies


def main(module, cfg):
    mp, wrapping = get_policies(cfg)
    model = FSDP(module, auto_wrap_policy=wrapping, mixed_precision=mp if not cfg.pure_bf16 else None, device_id=torch.device("cpu"))
    model(torch.ones(2)).sum().backward()
'''

# A constructor that stays FSDP1 (arguments from a dict it cannot read), reading the same settings.
KEPT = b'''from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from pkg.policies import get_policies


def legacy(module, cfg):
    mp, wrapping = get_policies(cfg)
    return FSDP(module, auto_wrap_policy=wrapping, mixed_precision=mp, **cfg.extra)
'''


def _rewrite(files):
    selection = Selection.from_prefixes(None, None)
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()])
    return {r.path: r.new_source.decode() for r in results}


def test_settings_reaching_only_converted_constructors_take_their_fsdp2_form_where_defined():
    out = _rewrite({"pkg/policies.py": POLICIES, "pkg/train.py": TRAIN})
    assert "bf16 = fsdp2_mixed_precision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)" in out["pkg/policies.py"]
    assert "wrapping = (torch.nn.Linear,)" in out["pkg/policies.py"]
    assert "torch.distributed.fsdp.wrap" not in out["pkg/policies.py"] and "MixedPrecision\n" not in out["pkg/policies.py"]
    assert "import functools" not in out["pkg/policies.py"]
    assert "_fsdp1_mixed_precision(mp if not cfg.pure_bf16 else None)" in out["pkg/train.py"]


def test_settings_that_also_reach_a_constructor_that_stays_stay_fsdp1():
    out = _rewrite({"pkg/policies.py": POLICIES, "pkg/train.py": TRAIN, "pkg/legacy.py": KEPT})
    assert out["pkg/policies.py"].count("TODO(migrate-fsdp)") == 2
    assert "bf16 = MixedPrecision(" in out["pkg/policies.py"] and "functools.partial(transformer_auto_wrap_policy" in out["pkg/policies.py"]
    assert "fully_shard(module" in out["pkg/train.py"]  # it reads either form at run time


@pytest.mark.parametrize(
    "elsewhere",
    [
        b"from pkg.policies import bf16\n\nprint(bf16.param_dtype)\n",  # an attribute read: FSDP1's object expected
        b"from pkg.policies import bf16\nfrom accelerate import FullyShardedDataParallelPlugin\n\nFullyShardedDataParallelPlugin(mixed_precision_policy=bf16)\n",
        b"import pkg.policies\n\nprint(pkg.policies.bf16.param_dtype)\n",  # through the module: followed, then read
        b"from pkg.policies import bf16\n\nPOLICIES = {'bf16': bf16}\nchoose(POLICIES)\n",  # a container handed on
    ],
)
def test_a_mixed_precision_read_anywhere_else_stays(elsewhere):
    out = _rewrite({"pkg/policies.py": POLICIES, "pkg/train.py": TRAIN, "pkg/other.py": elsewhere})
    assert "bf16 = MixedPrecision(" in out["pkg/policies.py"]
    assert "wrapping = (torch.nn.Linear,)" in out["pkg/policies.py"]  # the policy reaches nothing else


def test_printing_a_setting_does_not_keep_it():
    out = _rewrite({"pkg/policies.py": POLICIES, "pkg/train.py": TRAIN, "pkg/other.py": b"from pkg.policies import bf16\n\nprint(bf16)\n"})
    assert "bf16 = fsdp2_mixed_precision(" in out["pkg/policies.py"]


def _flow(files):
    return ValueFlow(RemoteCalls(files))


def _position_of(source: bytes, text: bytes) -> tuple[int, int]:
    before = source[: source.index(text)]
    return before.count(b"\n") + 1, len(before) - (before.rfind(b"\n") + 1) + 1


def test_a_setting_is_followed_through_a_package_star_re_export_and_an_alias():
    files = {
        "pkg/policies/__init__.py": b"from pkg.policies.mixed import *\n",
        "pkg/policies/mixed.py": b"import torch\nfrom torch.distributed.fsdp import MixedPrecision\n\nbf16 = MixedPrecision(param_dtype=torch.bfloat16)\n",
        "pkg/train.py": b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nfrom pkg.policies import bf16 as chosen\n\n\ndef main(m):\n    return FSDP(m, mixed_precision=chosen)\n",
    }
    position = _position_of(files["pkg/policies/mixed.py"], b"MixedPrecision(param")
    assert _flow(files).sinks("pkg/policies/mixed.py", position) == {Sink("pkg/train.py", (6, 12), "mixed_precision")}


def test_a_star_import_of_the_defining_module_counts_as_a_read():
    files = {
        "pkg/mixed.py": b"import torch\nfrom torch.distributed.fsdp import MixedPrecision\n\nbf16 = MixedPrecision(param_dtype=torch.bfloat16)\n",
        "pkg/train.py": b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nfrom pkg.mixed import *\n\n\ndef main(m):\n    return FSDP(m, mixed_precision=bf16)\n\n\ndef other():\n    return [bf16]\n",
    }
    position = _position_of(files["pkg/mixed.py"], b"MixedPrecision(param")
    assert _flow(files).sinks("pkg/mixed.py", position) is None  # `[bf16]`: in a container


def test_a_returned_setting_must_be_unpacked_by_every_caller():
    policies = POLICIES + b"\n\ndef everything(cfg):\n    return get_policies(cfg)\n"
    files = {"pkg/policies.py": policies, "pkg/train.py": TRAIN}
    position = _position_of(policies, b"MixedPrecision(param")
    assert _flow(files).sinks("pkg/policies.py", position) is None
    position = _position_of(POLICIES, b"MixedPrecision(param")
    assert _flow({"pkg/policies.py": POLICIES, "pkg/train.py": TRAIN}).sinks("pkg/policies.py", position) == {
        Sink("pkg/train.py", (9, 13), "mixed_precision")
    }


def test_a_returned_setting_may_be_taken_by_its_index_at_the_call():
    position = _position_of(POLICIES, b"MixedPrecision(param")
    indexed = TRAIN.replace(b"mixed_precision=mp if", b"mixed_precision=get_policies(cfg)[0] if")
    assert _flow({"pkg/policies.py": POLICIES, "pkg/train.py": indexed}).sinks("pkg/policies.py", position) == {
        Sink("pkg/train.py", (9, 13), "mixed_precision")
    }
    wrong = TRAIN.replace(b"mixed_precision=mp if", b"mixed_precision=get_policies(cfg)[1] if")
    assert _flow({"pkg/policies.py": POLICIES, "pkg/train.py": wrong}).sinks("pkg/policies.py", position) is None


def test_the_rewritten_settings_file_parses_and_a_second_run_changes_nothing():
    first = _rewrite({"pkg/policies.py": POLICIES, "pkg/train.py": TRAIN})
    cst.parse_module(first["pkg/policies.py"])
    second = _rewrite({path: text.encode() for path, text in first.items()})
    assert second == first


UTILS = b'''import functools

import torch
from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy


def fsdp_auto_wrap_policy(layer_classes):
    def lambda_policy_fn(module):
        return len(list(module.named_children())) == 0 and getattr(module, "weight", None) is not None

    lambda_policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda_policy_fn)
    transformer_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(layer_classes))
    auto_wrap_policy = functools.partial(_or_policy, policies=[lambda_policy, transformer_wrap_policy])
    return auto_wrap_policy
'''

PEFT_TRAIN = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from pkg.utils import fsdp_auto_wrap_policy


def main(module):
    policy = fsdp_auto_wrap_policy([torch.nn.Sequential])
    return FSDP(module, auto_wrap_policy=policy, device_id=torch.device("cpu"))
'''


def test_an_or_policy_and_the_policies_it_combines_convert_together():
    out = _rewrite({"pkg/utils.py": UTILS, "pkg/train.py": PEFT_TRAIN})["pkg/utils.py"]
    assert "lambda_policy = functools.partial(_fsdp1_lambda_policy, lambda_fn=lambda_policy_fn)" in out
    assert "transformer_wrap_policy = tuple(layer_classes)" in out
    assert "auto_wrap_policy = functools.partial(_fsdp1_or_policy, policies=[lambda_policy, transformer_wrap_policy])" in out
    assert "torch.distributed.fsdp" not in out and "TODO" not in out


def test_an_or_policy_nothing_reads_keeps_its_policies_while_the_program_keeps_fsdp1():
    kept = PEFT_TRAIN.replace(b"policy = fsdp_auto_wrap_policy([torch.nn.Sequential])\n    ", b"").replace(b"auto_wrap_policy=policy, ", b"**cfg, ")
    out = _rewrite({"pkg/utils.py": UTILS, "pkg/train.py": kept})
    assert out["pkg/utils.py"] == UTILS.decode().replace("    lambda_policy =", "    # TODO(migrate-fsdp): MF102 FSDP1 auto-wrap policy left as is\n    lambda_policy =").replace(
        "    transformer_wrap_policy =", "    # TODO(migrate-fsdp): MF102 FSDP1 auto-wrap policy left as is\n    transformer_wrap_policy ="
    ).replace("    auto_wrap_policy =", "    # TODO(migrate-fsdp): MF102 FSDP1 auto-wrap policy left as is\n    auto_wrap_policy =")


def test_a_setting_nothing_reads_converts_in_a_program_without_fsdp1_constructors():
    out = _rewrite({"pkg/policies.py": b"import torch\nfrom torch.distributed.fsdp import MixedPrecision\n\nfp32 = MixedPrecision(param_dtype=torch.float32)\n"})
    assert "fp32 = fsdp2_mixed_precision(param_dtype=torch.float32)" in out["pkg/policies.py"]


def test_a_setting_read_as_an_attribute_of_its_imported_package_is_followed():
    files = {
        "policies/__init__.py": b"from .mixed import *\n",
        "policies/mixed.py": b"import torch\nfrom torch.distributed.fsdp import MixedPrecision\n\nbf16 = MixedPrecision(param_dtype=torch.bfloat16)\n",
        "train.py": b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nimport policies\n\n\ndef main(m):\n    return FSDP(m, mixed_precision=policies.bf16)\n",
    }
    position = _position_of(files["policies/mixed.py"], b"MixedPrecision(param")
    assert _flow(files).sinks("policies/mixed.py", position) == {Sink("train.py", (6, 12), "mixed_precision")}
    files["train.py"] += b"\n\ndef other(cfg):\n    return cfg.bf16\n"  # an attribute of something else: it may be ours
    assert _flow(files).sinks("policies/mixed.py", position) is None


def test_a_setting_in_a_table_is_followed_to_the_subscripts_that_read_it():
    table = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision

PRECISION = {"fp32": None, "bf16": MixedPrecision(param_dtype=torch.bfloat16)}


def main(module, args):
    return FSDP(module, mixed_precision=PRECISION[args.precision], device_id=torch.device("cpu"))
'''
    out = _rewrite({"train.py": table})["train.py"]
    assert '"bf16": fsdp2_mixed_precision(param_dtype=torch.bfloat16)' in out
    assert 'mixed_precision = _fsdp1_mixed_precision(PRECISION[args.precision])' in out
    listed = table + b"\n\ndef names():\n    return list(PRECISION)\n"  # the table read whole: it may go anywhere
    assert '"bf16": MixedPrecision(' in _rewrite({"train.py": listed})["train.py"]
