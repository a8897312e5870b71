"""The helper functions the rewrite inserts (migrate_fsdp/rewrite/helpers/): short, torch-only, no
private FSDP API, each as good as the FSDP1 code it stands for. Their use in rewritten training code is
tested in test_training_helpers.py and the runnable tests; here each is imported as the module it is."""

import importlib
from importlib import resources

import libcst as cst
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import StateDictType
from torch.distributed.fsdp.wrap import CustomPolicy, size_based_auto_wrap_policy

from migrate_fsdp.rewrite.helpers import helper_source

NAMES = sorted(
    path.name.removesuffix(".py")
    for path in resources.files("migrate_fsdp.rewrite.helpers").iterdir()
    if path.name.endswith(".py") and path.name != "__init__.py"
)


def helper(name):
    return getattr(importlib.import_module(f"migrate_fsdp.rewrite.helpers.{name}"), name)


def test_the_rewrite_uses_every_helper_file():
    from migrate_fsdp.rewrite import reshard
    from migrate_fsdp.rewrite.rules.construction import auto_wrap_policy, emit, forward_prefetch, mesh, mixed_precision, settings_where_defined
    from migrate_fsdp.rewrite.rules.training import (
        clip_grad_norm,
        fsdp_modules,
        no_sync,
        shard_sums,
        state_dicts,
        wrapper_attributes,
    )

    used = {
        auto_wrap_policy.TARGETS_HELPER,
        auto_wrap_policy.SIZE_HELPER,
        auto_wrap_policy.OR_HELPER,
        auto_wrap_policy.ORDER_HELPER,
        emit.INIT_HELPER,
        forward_prefetch.HELPER,
        mesh.SHARDING_HELPER,
        mesh.SHARDING_OVER_HELPER,
        "_fsdp1_strategy_name",  # inserted with the two above
        mesh.HYBRID_MESH_HELPER,
        mesh.REPLICATE_MESH_HELPER,
        mesh.GROUP_MESH_HELPER,
        mixed_precision.HELPER,
        mixed_precision.CAST_BUFFERS_HELPER,
        settings_where_defined.HELPER,
        settings_where_defined.LAMBDA_HELPER,
        clip_grad_norm.HELPER_NAME,
        clip_grad_norm.ANY_MODULE_HELPER,
        fsdp_modules.HELPER_NAME,
        no_sync.HELPER_NAME,
        state_dicts.OPTIM_LATER_HELPER,
        state_dicts.SHARDED_LOAD_HELPER,
        state_dicts.OPTIM_LOAD_HELPER,
        "fsdp1_unshared_steps",  # inserted with it
        state_dicts.GATHER_HELPER_NAME,
        state_dicts.FULL_KIND_HELPER,
        state_dicts.ANY_MODULE_SAVE_HELPER,
        state_dicts.ANY_MODULE_LOAD_HELPER,
        reshard.HELPER_NAME,
        shard_sums.HELPER,
        wrapper_attributes.PROCESS_GROUP_HELPER,
    }
    assert used == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_helper_defines_its_function_and_imports_only_torch(name):
    source = helper_source(name)
    assert [d.name.value for d in source.definitions if isinstance(d, cst.FunctionDef)] == [name]
    helpers = "migrate_fsdp.rewrite.helpers."  # a helper it needs, inserted with it
    assert all(module == "torch" or module.startswith(("torch.", helpers)) or module == "contextlib" for module, _ in source.imports)
    code = cst.Module(list(source.definitions)).code
    assert "_run_policy" not in code and "torch.distributed.fsdp._" not in code
    assert len(code.splitlines()) <= 60  # short: laid out at 88 columns, as black would


@pytest.mark.parametrize("leaves", [None, set(), {nn.Linear}])
@pytest.mark.parametrize("excluded", [None, set(), {nn.Sequential}])
def test_size_based_policy_answers_as_fsdp1s(leaves, excluded):
    ours = helper("_size_based_auto_wrap_policy")
    modules = [nn.Linear(2, 2), nn.MultiheadAttention(4, 2), nn.ModuleList(), nn.Sequential(), nn.LayerNorm(3)]
    for module in modules:
        for recurse in (True, False):
            for numel in (10, 10**9):
                options = {"min_num_params": 100, "force_leaf_modules": leaves, "exclude_wrap_modules": excluded}
                expected = size_based_auto_wrap_policy(module, recurse, numel, **options)
                assert ours(module, recurse, numel, **options) == expected, (module, recurse, numel)


def test_wrap_targets_refuses_a_custom_policy_at_run_time():
    with pytest.raises(NotImplementedError, match="CustomPolicy"):
        helper("_fsdp1_wrap_targets")(nn.Sequential(nn.Linear(2, 2)), CustomPolicy(lambda m: True))


def test_root_modules_stops_at_the_outermost_fsdp_modules():
    from torch.distributed.fsdp import FSDPModule

    def sharded():  # as fully_shard marks a module, without a process group
        module = nn.Linear(2, 2)
        module.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})
        return module

    inner, outer = sharded(), sharded()
    outer.add_module("inner", inner)
    model = nn.Sequential(nn.ReLU(), outer, nn.Sequential(sharded()))
    assert helper("fsdp2_root_modules")(model) == [outer, model[2][0]]


def test_cast_buffers_leaves_units_sharded_earlier_full_precision_and_ignored_modules():
    from torch.distributed.fsdp import FSDPModule

    def with_buffer(module):
        module.register_buffer("running", torch.zeros(2))
        module.register_buffer("count", torch.zeros(2, dtype=torch.long))
        return module

    unit = with_buffer(nn.Linear(2, 2))
    unit.__class__ = type("FSDPLinear", (FSDPModule, nn.Linear), {})  # sharded by an earlier call
    unit.add_module("inside", with_buffer(nn.Linear(2, 2)))
    model = with_buffer(nn.Sequential(with_buffer(nn.Linear(2, 2)), nn.BatchNorm1d(2), unit, with_buffer(nn.Linear(2, 2))))
    helper("fsdp2_cast_buffers")(model, torch.bfloat16, nn.modules.batchnorm._BatchNorm, {model[3]})
    dtypes = {name: buffer.dtype for name, buffer in model.named_buffers()}
    assert dtypes == {
        "running": torch.bfloat16,
        "count": torch.long,
        "0.running": torch.bfloat16,
        "0.count": torch.long,
        "1.running_mean": torch.float32,
        "1.running_var": torch.float32,
        "1.num_batches_tracked": torch.long,
        "2.running": torch.float32,
        "2.count": torch.long,
        "2.inside.running": torch.float32,
        "2.inside.count": torch.long,
        "3.running": torch.float32,
        "3.count": torch.long,
    }


def test_full_state_dict_offloads_and_keeps_nesting():
    state = {"w": torch.ones(2), "groups": [{"lr": 0.1}]}
    assert helper("fsdp2_full_state_dict")(state, offload_to_cpu=True, rank0_only=False) == state


def test_mixed_precision_none_is_fsdp2s_default_and_casts_nothing():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    converted = helper("_fsdp1_mixed_precision")(None)
    assert converted == {
        "root": MixedPrecisionPolicy(),
        "children": MixedPrecisionPolicy(),
        "full_precision_classes": (),
        "full_precision": MixedPrecisionPolicy(),
        "buffer_dtype": None,
    }


def test_mixed_precision_takes_an_fsdp2_policy_as_it_is():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, cast_forward_inputs=False)
    converted = helper("_fsdp1_mixed_precision")(policy)
    assert converted["root"] is policy and converted["children"] is policy
    assert converted["full_precision_classes"] == () and converted["buffer_dtype"] is None


@pytest.mark.parametrize(("cast", "cast_root", "root_casts", "children_cast"), [(False, True, True, False), (True, False, True, True), (False, False, False, False)])
def test_mixed_precision_casts_inputs_where_fsdp1_did(cast, cast_root, root_casts, children_cast):
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    fsdp1 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=cast, cast_root_forward_inputs=cast_root)
    converted = helper("_fsdp1_mixed_precision")(fsdp1)
    assert converted["root"] == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=root_casts)
    assert converted["children"] == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=children_cast)


def test_mixed_precision_keeps_fsdp1s_full_precision_modules_and_buffer_dtype():
    from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy

    convert = helper("_fsdp1_mixed_precision")
    default = convert(MixedPrecision(param_dtype=torch.float16, buffer_dtype=torch.float16))
    assert default["full_precision_classes"] == (nn.modules.batchnorm._BatchNorm,)
    assert default["full_precision"] == MixedPrecisionPolicy(param_dtype=torch.float32, output_dtype=torch.float16)
    assert default["buffer_dtype"] is torch.float16
    assert convert(MixedPrecision(param_dtype=torch.float16, _module_classes_to_ignore=[nn.LayerNorm]))["full_precision_classes"] == (nn.LayerNorm,)
    assert convert(MixedPrecision(reduce_dtype=torch.float16))["full_precision"] == MixedPrecisionPolicy()


def test_mixed_precision_refuses_low_precision_grads_when_it_runs():
    from torch.distributed.fsdp import MixedPrecision

    with pytest.raises(NotImplementedError, match="keep_low_precision_grads"):
        helper("_fsdp1_mixed_precision")(MixedPrecision(param_dtype=torch.bfloat16, keep_low_precision_grads=True))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32, "buffer_dtype": torch.bfloat16},
        {"param_dtype": torch.float16, "cast_forward_inputs": True, "cast_root_forward_inputs": False},
        {"param_dtype": torch.bfloat16, "_module_classes_to_ignore": [nn.LayerNorm]},
    ],
)
def test_mixed_precision_defined_in_fsdp2_form_gives_what_the_run_time_conversion_gives(fields):
    """MF112's form of a MixedPrecision where it is defined, and the constructor's helper reading either form."""
    from torch.distributed.fsdp import MixedPrecision

    defined = helper("fsdp2_mixed_precision")(**fields)
    assert defined == helper("_fsdp1_mixed_precision")(MixedPrecision(**fields))
    assert helper("_fsdp1_mixed_precision")(defined) is defined


def test_mixed_precision_defined_in_fsdp2_form_refuses_low_precision_grads_when_it_runs():
    with pytest.raises(NotImplementedError, match="keep_low_precision_grads"):
        helper("fsdp2_mixed_precision")(param_dtype=torch.bfloat16, keep_low_precision_grads=True)


def test_wrap_targets_take_the_classes_of_a_policy_converted_where_it_was_defined():
    import functools

    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, transformer_auto_wrap_policy

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    targets = helper("_fsdp1_wrap_targets")
    picked = targets(model, (nn.Linear, nn.ReLU))
    assert picked == targets(model, functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.Linear, nn.ReLU}))
    assert picked == targets(model, ModuleWrapPolicy({nn.Linear, nn.ReLU}))
    assert picked == [model[0][0], model[0][1], model[1], model[2][0]]


def test_a_policy_of_none_wraps_nothing_as_fsdp1_did():
    """`auto_wrap_policy=None` chosen at run time (a NO_SHARD branch) through a kwargs dict: no unit but the root."""
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    assert helper("_fsdp1_wrap_targets")(model, None, full_precision=nn.modules.batchnorm._BatchNorm) == []


def test_lambda_and_or_policies_defined_in_fsdp2_form_pick_what_fsdp1s_picked():
    import functools

    from torch.distributed.fsdp.wrap import _or_policy, lambda_auto_wrap_policy, transformer_auto_wrap_policy

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.LayerNorm(2), nn.Sequential(nn.Linear(2, 2)))
    targets, is_norm = helper("_fsdp1_wrap_targets"), (lambda m: isinstance(m, nn.LayerNorm))
    lambda_policy = functools.partial(helper("_fsdp1_lambda_policy"), lambda_fn=is_norm)
    assert targets(model, lambda_policy) == targets(model, functools.partial(lambda_auto_wrap_policy, lambda_fn=is_norm)) == [model[1]]
    fsdp1 = functools.partial(
        _or_policy,
        policies=[functools.partial(lambda_auto_wrap_policy, lambda_fn=is_norm), functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.ReLU})],
    )
    ours = functools.partial(helper("_fsdp1_or_policy"), policies=[lambda_policy, (nn.ReLU,)])
    assert targets(model, ours) == targets(model, fsdp1) == [model[0][1], model[1]]


def test_full_precision_classes_force_recursion_only_when_given():
    """FSDP1 descended into every module only under mixed precision (its full-precision classes' or-policy):
    `()` (a run-time choice without mixed precision) must leave the user's policy alone."""

    def no_descend_into_first(module, recurse, nonwrapped_numel):
        return module is not model[0] if recurse else isinstance(module, nn.Linear)

    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)), nn.Linear(2, 2))
    targets = helper("_fsdp1_wrap_targets")
    assert targets(model, no_descend_into_first, full_precision=()) == [model[1]]
    forced = [model[0][0], model[0][1], model[1]]
    assert targets(model, no_descend_into_first, full_precision=nn.modules.batchnorm._BatchNorm) == forced
    assert targets(model, no_descend_into_first, full_precision=(nn.modules.batchnorm._BatchNorm,)) == forced


def test_sharding_counts_fsdp1s_nodes_with_the_device_handle_of_the_device_type(monkeypatch):
    """FSDP1's HYBRID_SHARD without a mesh builds (world // devices per node, devices per node) from the module's
    device handle: `torch.cpu.device_count()` is 1, so a CPU run replicates over every rank."""
    sharding = importlib.import_module("migrate_fsdp.rewrite.helpers._fsdp1_sharding")
    built = []
    monkeypatch.setattr(sharding, "get_world_size", lambda: 2)
    monkeypatch.setattr(sharding, "init_device_mesh", lambda device, shape, **names: built.append((device, shape)) or "mesh")
    assert sharding._fsdp1_sharding("HYBRID_SHARD", "cpu") == {"mesh": "mesh"}
    assert built == [("cpu", (2, 1))]


def test_unshared_steps_give_each_parameter_its_own_step_and_keep_the_rest():
    step = torch.tensor(5.0)
    moment = torch.ones(2)
    saved = {"state": {"a": {"step": step, "exp_avg": moment}, "b": {"step": step}}, "param_groups": [{"lr": 0.1}]}
    unshared = helper("fsdp1_unshared_steps")(saved)
    assert unshared["state"]["a"]["step"] is not unshared["state"]["b"]["step"]
    assert unshared["state"]["a"]["step"].item() == 5.0 and unshared["state"]["a"]["exp_avg"] is moment
    assert unshared["param_groups"] is saved["param_groups"] and saved["state"]["a"]["step"] is step
    assert helper("fsdp1_unshared_steps")(None) is None and helper("fsdp1_unshared_steps")({}) == {}



def test_set_optimizer_state_dict_takes_what_fsdp1s_load_took():
    """A scheduler's `initial_lr` saved and no scheduler built yet, and gradients still set on a fresh optimizer: FSDP1's
    `optim.load_state_dict` took both; FSDP2's setter alone raises on each."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: 0.5**step)
    model(torch.randn(4, 3)).sum().backward()
    optim.step()
    scheduler.step()
    saved = get_optimizer_state_dict(model, optim)
    fresh = torch.optim.Adam(model.parameters(), lr=0.1)
    grads = [param.grad for param in model.parameters()]
    helper("fsdp2_set_optimizer_state_dict")(model, fresh, saved)
    assert fresh.param_groups[0]["initial_lr"] == 0.1 and fresh.param_groups[0]["lr"] == 0.05
    assert all(param.grad is grad for param, grad in zip(model.parameters(), grads))
    for loaded, trained in zip(fresh.state_dict()["state"].values(), optim.state_dict()["state"].values()):
        assert torch.equal(loaded["exp_avg"], trained["exp_avg"]) and torch.equal(loaded["exp_avg_sq"], trained["exp_avg_sq"])


@pytest.mark.parametrize(
    "kind, full",
    [
        ("FULL_STATE_DICT", True),
        ("SHARDED_STATE_DICT", False),
        (StateDictType.FULL_STATE_DICT, True),
        (StateDictType.LOCAL_STATE_DICT, False),
    ],
)
def test_full_state_dict_reads_fsdp1s_type_as_a_member_or_its_name(kind, full):
    assert helper("_fsdp1_full_state_dict")(kind) is full


def test_full_state_dict_refuses_a_misspelt_type_when_it_runs():
    with pytest.raises(ValueError, match="unknown FSDP1 state-dict type"):
        helper("_fsdp1_full_state_dict")("FULL_STATEDICT")


def test_state_dict_helpers_leave_modules_fsdp2_did_not_shard_to_their_own_methods():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert helper("fsdp2_state_dict")(model).keys() == model.state_dict().keys()
    state = {"0.weight": torch.zeros(2, 2), "extra": torch.ones(1)}
    result = helper("fsdp2_load_state_dict")(model, state, strict=False)
    assert result.missing_keys == ["0.bias"] and result.unexpected_keys == ["extra"]
    assert torch.equal(model[0].weight, torch.zeros(2, 2))


@pytest.mark.parametrize(
    "strategy, device_type, expected",
    [
        ("FULL_SHARD", "cpu", {"mesh": ("cpu", (2,))}),
        ("SHARD_GRAD_OP", "cpu", {"mesh": ("cpu", (2,)), "reshard_after_forward": False}),
        ("FULL_SHARD", None, {}),
        ("SHARD_GRAD_OP", None, {"reshard_after_forward": False}),
    ],
)
def test_sharding_keeps_fsdp1s_device_where_it_was_given(monkeypatch, strategy, device_type, expected):
    """FSDP1 sharded over device_id's device: a CPU program keeps a CPU mesh even where CUDA is (fully_shard's
    default mesh is the accelerator's). Without a device, FSDP1's and FSDP2's defaults are the same device."""
    sharding = importlib.import_module("migrate_fsdp.rewrite.helpers._fsdp1_sharding")
    monkeypatch.setattr(sharding, "get_world_size", lambda: 2)
    monkeypatch.setattr(sharding, "init_device_mesh", lambda device, shape, **names: (device, shape))
    assert sharding._fsdp1_sharding(strategy, device_type) == expected


def test_module_clip_grad_norm_leaves_a_module_fsdp2_did_not_shard_to_its_own_method():
    """An FSDP1 model that stays (or anything with the method) clips itself, with the arguments it was given."""

    class OwnClip:
        def clip_grad_norm_(self, max_norm, norm_type=2.0):
            self.called = (max_norm, norm_type)
            return torch.tensor(3.0)

    model = OwnClip()
    assert helper("fsdp2_module_clip_grad_norm_")(model, 1.0, 1.0) == 3.0 and model.called == (1.0, 1.0)


def test_local_reads_a_dtensors_shard_and_leaves_any_other_tensor():
    from torch.distributed.tensor import DTensor, Replicate, init_device_mesh

    local = helper("fsdp2_local")
    plain = torch.arange(4.0)
    assert local(plain) is plain
    started = not torch.distributed.is_initialized()
    if started:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        shard = DTensor.from_local(plain, init_device_mesh("cpu", (1,)), [Replicate()])
        assert not isinstance(local(shard), DTensor) and torch.equal(local(shard), plain)
    finally:
        if started:
            torch.distributed.destroy_process_group()


def test_process_group_is_the_one_fsdp1_sharded_over_and_any_other_modules_own():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    group_of = helper("fsdp2_process_group")

    class Wrapper(nn.Module):  # DDP's and FSDP1's own attribute
        process_group = "its own"

    assert group_of(Wrapper()) == "its own"
    started = not torch.distributed.is_initialized()
    if started:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        sharded = fully_shard(nn.Linear(2, 2), mesh=init_device_mesh("cpu", (1,)))
        assert torch.distributed.get_process_group_ranks(group_of(sharded)) == [0]
        mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard"))
        replicated = fully_shard(nn.Linear(2, 2), mesh=mesh)
        assert group_of(replicated) is mesh.get_group(0)
    finally:
        if started:
            torch.distributed.destroy_process_group()


def test_wrap_order_is_fsdp1s_children_in_order_before_their_parents_each_once():
    shared = nn.Linear(2, 2)
    first = nn.Sequential(nn.Linear(2, 2), shared)
    root = nn.Sequential(first, nn.Sequential(shared, nn.ReLU()))
    order = helper("_fsdp1_wrap_order")(root)
    assert order == [first[0], shared, first, root[1][1], root[1]]


def test_param_init_runs_on_a_units_modules_breadth_first_only_where_it_has_meta_tensors():
    with torch.device("meta"):
        root = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2)))
    seen = []

    def init(module):
        seen.append(module)
        module.to_empty(device="cpu", recurse=False)

    param_init = helper("fsdp1_param_init")
    assert param_init(root, init) is root
    assert seen == [root, root[0], root[1], root[1][0]]
    assert not any(p.is_meta for p in root.parameters())
    assert param_init(root, init) is root and len(seen) == 4  # nothing on meta any more
    with torch.device("meta"), pytest.raises(NotImplementedError, match="param_init_fn is None"):
        param_init(nn.Linear(2, 2), None)
