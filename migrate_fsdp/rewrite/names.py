"""Which qualified names are FSDP1, and the cheap byte test that rules a file out.

FSDP1 and FSDP2 share the `torch.distributed.fsdp` package, so "imports
torch.distributed.fsdp" is not enough: a name is FSDP1 unless it is one of the
FSDP2 exports. The list is written out (not read from torch) so that `rewrite`
never imports torch; `tests/rewrite/test_names.py` checks it against the
installed torch.
"""

import re

FSDP_PACKAGE = "torch.distributed.fsdp"

# Public names of torch.distributed.fsdp that belong to FSDP2.
FSDP2_EXPORTS = frozenset(
    {
        "CPUOffloadPolicy",
        "DataParallelMeshDims",
        "FSDPModule",
        "fully_shard",
        "MixedPrecisionPolicy",
        "OffloadPolicy",
        "register_fsdp_forward_method",
        "UnshardHandle",
        "share_comm_ctx",
    }
)

# Public FSDP1 names of torch.distributed.fsdp (its __all__ minus FSDP2).
FSDP1_EXPORTS = frozenset(
    {
        "BackwardPrefetch",
        "CPUOffload",
        "FullOptimStateDictConfig",
        "FullStateDictConfig",
        "FullyShardedDataParallel",
        "LocalOptimStateDictConfig",
        "LocalStateDictConfig",
        "MixedPrecision",
        "OptimStateDictConfig",
        "OptimStateKeyType",
        "ShardedOptimStateDictConfig",
        "ShardedStateDictConfig",
        "ShardingStrategy",
        "StateDictConfig",
        "StateDictSettings",
        "StateDictType",
    }
)

# torch.distributed.fsdp.wrap: FSDP1's auto-wrap policies and manual wrapping.
WRAP_EXPORTS = frozenset(
    {
        "always_wrap_policy",
        "lambda_auto_wrap_policy",
        "transformer_auto_wrap_policy",
        "size_based_auto_wrap_policy",
        "enable_wrap",
        "wrap",
        "CustomPolicy",
        "ModuleWrapPolicy",
        "_or_policy",
        "_Policy",
        "_module_wrap_policy",
        "_wrap_module_cls_individually",
        "ParamExecOrderWrapPolicy",
    }
)

# Submodules whose public names are re-exported at the package level, so
# `torch.distributed.fsdp.api.ShardingStrategy` is the same thing as
# `torch.distributed.fsdp.ShardingStrategy`.
_REEXPORTING_SUBMODULES = ("fully_sharded_data_parallel", "api")

# FSDP2 lives under these modules too (its private home and its pre-2.6 one).
_FSDP2_MODULES = (
    "torch.distributed.fsdp._fully_shard",
    "torch.distributed._composable.fsdp",
)

# Other FSDP1 names a file may reach for, apart from the exports above.
_OTHER_FSDP1_TOKENS = (
    "fully_sharded_data_parallel",
    "sharded_grad_scaler",
    "ShardedGradScaler",
    "FlatParameter",
    "_flat_param",
    "_fsdp_wrapped_module",
    "_runtime_utils",
    "_state_dict_utils",
    "_optim_utils",
    "_common_utils",
    "_init_utils",
    "_wrap_utils",
    "_traversal_utils",
    "_unshard_param_utils",
    "_exec_order_utils",
    "_debug_utils",
    "_shard_utils",
    "_fsdp_extensions",
    "_limiter_utils",
    "_dynamo_utils",
    "_trace_utils",
    "api",
)


def canonical(qualified_name: str) -> str:
    """Spell an FSDP name the way users import it: drop re-exporting submodules."""
    for submodule in _REEXPORTING_SUBMODULES:
        prefix = f"{FSDP_PACKAGE}.{submodule}."
        if qualified_name.startswith(prefix):
            rest = qualified_name[len(prefix) :]
            head = rest.split(".", 1)[0]
            if head in FSDP1_EXPORTS:
                return f"{FSDP_PACKAGE}.{rest}"
    return qualified_name


def is_fsdp1(qualified_name: str) -> bool:
    """True for a name inside torch.distributed.fsdp that is not FSDP2's."""
    if not qualified_name.startswith(FSDP_PACKAGE + "."):
        return False
    if qualified_name.startswith(_FSDP2_MODULES):
        return False
    head = qualified_name[len(FSDP_PACKAGE) + 1 :].split(".", 1)[0]
    return head not in FSDP2_EXPORTS


def is_fsdp2(qualified_name: str) -> bool:
    """True for FSDP2's names, wherever they are imported from."""
    if qualified_name.startswith(_FSDP2_MODULES):
        return True
    head, _, rest = qualified_name.removeprefix(FSDP_PACKAGE + ".").partition(".")
    return qualified_name.startswith(FSDP_PACKAGE + ".") and head in FSDP2_EXPORTS


_TOKENS = sorted(FSDP1_EXPORTS | WRAP_EXPORTS | set(_OTHER_FSDP1_TOKENS), key=len, reverse=True)
_TOKEN_RE = re.compile(rb"\b(?:" + b"|".join(re.escape(t.encode()) for t in _TOKENS) + rb")\b")
# The ways a file can reach torch.distributed.fsdp by absolute name.
_ROUTE_RE = re.compile(
    rb"torch\.distributed\.fsdp"
    rb"|from\s+torch\.distributed\s+import\s+(?:\([^)]*|[^\n]*)\bfsdp\b"
    rb"|from\s+torch\s+import\s+(?:\([^)]*|[^\n]*)\bdistributed\b"
    rb"|import\s+torch\.distributed\s+as\b"
)


def may_use_fsdp1(source: bytes) -> bool:
    """Cheap test that is True for every file in which an FSDP1 name can resolve.

    A reference resolves to torch.distributed.fsdp.X only through an import
    naming torch.distributed.fsdp, or torch.distributed / its `fsdp`
    attribute; the file then spells "fsdp" and spells X, or the FSDP1
    submodule X lives in. Files failing this are never parsed: parsing and
    scope analysis cost about a millisecond a line.
    """
    return b"fsdp" in source and _TOKEN_RE.search(source) is not None and _ROUTE_RE.search(source) is not None
