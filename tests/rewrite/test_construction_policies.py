"""The auto_wrap_policy conversion shards exactly the modules FSDP1 wraps, children first, root last.

A differential test without processes: for each policy (and with ignored
modules and mixed precision, written or known only at run time), an FSDP1 snippet is rewritten and executed with
`fully_shard` replaced by a recorder, while FSDP1's own `_auto_wrap` runs on
an identical model with a recording wrapper. Both must pick the same modules
(by FQN), with FSDP1's full-precision override on the same ones, and the
rewrite must call fully_shard on every child before its parent and on the
root last. Models: the fixture model of `wrap_policies` plus random trees.
"""

import functools
import random

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp._init_utils import _get_ignored_modules, _get_ignored_params
from torch.distributed.fsdp._wrap_utils import _auto_wrap

from migrate_fsdp.rewrite.api import rewrite_source
from migrate_fsdp.rewrite.selection import LEFTOVER, Selection

POLICIES = {
    "module_wrap": "ModuleWrapPolicy({Block})",
    "module_wrap_name": "ModuleWrapPolicy(CLASSES)",
    "transformer": "functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block, nn.LayerNorm})",
    "size_small": "functools.partial(size_based_auto_wrap_policy, min_num_params=300)",
    "size_mid": "functools.partial(size_based_auto_wrap_policy, min_num_params=1500)",
    "size_remainder": "functools.partial(size_based_auto_wrap_policy, min_num_params=2300)",
    "size_default": "size_based_auto_wrap_policy",
    "size_leaves": (
        "functools.partial(size_based_auto_wrap_policy, min_num_params=100, force_leaf_modules={Block}, "
        "exclude_wrap_modules={nn.Sequential})"
    ),
    "lambda": "functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.Linear) and m.out_features > 16)",
    "lambda_function": "functools.partial(lambda_auto_wrap_policy, lambda_fn=is_norm)",
    "custom": "CustomPolicy(lambda m: isinstance(m, (nn.LayerNorm, nn.BatchNorm1d)))",
    "or_static": (
        "functools.partial(_or_policy, policies=[ModuleWrapPolicy({nn.Sequential}), "
        "functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, nn.Embedding))])"
    ),
    "or_size": (
        "functools.partial(_or_policy, policies=[ModuleWrapPolicy({nn.Sequential}), "
        "functools.partial(size_based_auto_wrap_policy, min_num_params=1500)])"
    ),
    "always": "always_wrap_policy",
    "user_callable": "user_policy",
    "run_time_object": "policy_from_caller",
    "run_time_module_wrap": "policy_from_caller",
}
# What `policy_from_caller` is at run time, for the policies known only then.
RUN_TIME = {"run_time_object": "size_mid", "run_time_module_wrap": "module_wrap"}
OPTIONS = {
    "plain": "",
    "ignored": ", ignored_modules=[model.frozen]",
    "mixed": ", mixed_precision=MixedPrecision(param_dtype=torch.bfloat16)",
    "mixed_ignored": ", mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), ignored_modules=[model.frozen]",
    "mixed_run_time": ", mixed_precision=MIXED_FROM_ELSEWHERE",  # read by the _fsdp1_mixed_precision helper
}

SNIPPET = """
import functools

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    _or_policy,
    always_wrap_policy,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from tests.rewrite.test_construction_policies import Block, CLASSES, MIXED_FROM_ELSEWHERE, is_norm, user_policy


def wrap(model, policy_from_caller):
    model = FSDP(model, auto_wrap_policy=POLICY OPTIONS)
    return model
"""


class Block(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.inner = nn.Linear(width, 4 * width)
        self.outer = nn.Linear(4 * width, width)
        self.norm = nn.LayerNorm(width)


class Net(nn.Module):
    """The model of fixtures/train/wrap_policies, with a frozen layer to ignore."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16))
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.tower = nn.Sequential(Block(), nn.Linear(16, 16))
        self.frozen = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)


def random_tree(seed: int) -> nn.Module:
    """A random nesting of containers and layers of random sizes (the same tree for the same seed)."""
    rng = random.Random(seed)

    def layer(depth):
        kind = rng.choice(["linear", "norm", "batch_norm", "embedding", "block", "container", "container"])
        if kind == "container" and depth < 3:
            children = [layer(depth + 1) for _ in range(rng.randint(1, 3))]
            return nn.Sequential(*children) if rng.random() < 0.6 else nn.ModuleList(children)
        width = rng.choice([4, 8, 24, 40])
        return {
            "linear": lambda: nn.Linear(width, rng.choice([4, 16, 32])),
            "norm": lambda: nn.LayerNorm(width),
            "batch_norm": lambda: nn.BatchNorm1d(width),
            "embedding": lambda: nn.Embedding(rng.choice([10, 100]), width),
            "block": lambda: Block(width),
            "container": lambda: nn.Linear(width, width),
        }[kind]()

    model = nn.Module()
    for index in range(rng.randint(2, 4)):
        model.add_module(f"part{index}", layer(0))
    model.frozen = nn.Linear(8, 8)
    return model


CLASSES = [Block, nn.Embedding]
MIXED_FROM_ELSEWHERE = MixedPrecision(param_dtype=torch.bfloat16)  # a MixedPrecision the rewrite cannot read


def is_norm(module):
    return isinstance(module, (nn.LayerNorm, nn.BatchNorm1d))


def user_policy(module, recurse, nonwrapped_numel):
    return recurse or (nonwrapped_numel >= 500 and not isinstance(module, nn.ModuleList))


MODELS = {"net": Net, **{f"random{seed}": functools.partial(random_tree, seed) for seed in range(6)}}


def _fsdp1_wrapped(make_model, policy, options) -> dict[str, bool]:
    """FQN -> whether FSDP1 kept it in full precision, for every module FSDP1's _auto_wrap wraps."""
    model = make_model()
    names = {module: name for name, module in model.named_modules()}
    wrapped = {}

    ignored = _get_ignored_modules(model, [model.frozen] if "ignored" in options else None)
    mixed = MixedPrecision(param_dtype=torch.bfloat16) if "mixed" in options else None

    def record(module, **kwargs):
        wrapped[names[module]] = mixed is not None and kwargs["mixed_precision"] is None
        return module

    root_kwargs = {"mixed_precision": mixed}
    _auto_wrap(model, policy, ignored, _get_ignored_params(model, ignored), root_kwargs, record)
    return wrapped


def _rewritten_wrap(policy_source: str, options: str):
    source = SNIPPET.replace("POLICY", policy_source).replace("OPTIONS", OPTIONS[options])
    result = rewrite_source(source, "snippet.py")
    assert [str(d) for d in result.diagnostics] == []
    leftovers = rewrite_source(result.new_source, "rewritten.py", Selection(frozenset({LEFTOVER})), todo=False)
    assert leftovers.diagnostics == []  # no FSDP1 name left
    namespace = {}
    exec(compile(result.code, "rewritten.py", "exec"), namespace)
    return namespace


def _fsdp2_sharded(namespace, make_model, runtime_policy) -> tuple[dict[str, bool], list[str]]:
    model = make_model()
    names = {module: name for name, module in model.named_modules()}
    calls = []

    def fully_shard(module, **kwargs):
        policy = kwargs.get("mp_policy")
        calls.append((names[module], policy is not None and policy.param_dtype == torch.float32))
        return module

    namespace["fully_shard"] = fully_shard
    namespace["wrap"](model, runtime_policy)
    order = [name for name, _ in calls]
    return dict(calls[:-1]), order


def _policy_object(source: str):
    namespace = {}
    exec(SNIPPET.split("def wrap")[0], namespace)
    return eval(source, namespace)


@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("policy", list(POLICIES))
def test_same_modules_as_fsdp1(policy, options):
    source = POLICIES[policy]
    runtime_policy = _policy_object(POLICIES[RUN_TIME[policy]] if policy in RUN_TIME else "None")
    namespace = _rewritten_wrap(source, options)
    reference = _policy_object(POLICIES[RUN_TIME[policy]] if policy in RUN_TIME else source)
    for model_name, make_model in MODELS.items():
        expected = _fsdp1_wrapped(make_model, reference, options)
        got, order = _fsdp2_sharded(namespace, make_model, runtime_policy)
        assert order[-1] == "", f"{model_name}: the root must be sharded last"
        assert got == expected, f"{model_name}: {policy} with {options}"
        for index, name in enumerate(order[:-1]):
            later = order[index + 1 : -1]
            assert not any(other.startswith(name + ".") for other in later if name), f"{model_name}: {name} before a child"
