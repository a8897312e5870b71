"""The torch-only helpers the training rules add to rewritten files, run as the rewrite writes them.

A small FSDP1 module is rewritten and the result imported: the no_sync
helper is driven with a stand-in module that records
`set_requires_gradient_sync` (nesting, exceptions, the stored-method and
ExitStack forms); the others run on a real FSDP2 model in a one-rank gloo
group, in a child process so no process group leaks into the test session.
"""

import contextlib
import subprocess
import sys
import textwrap
import types

import pytest
from torch.distributed.fsdp import FSDPModule

from migrate_fsdp.rewrite.api import rewrite_source

FSDP1_MODULE = textwrap.dedent(
    '''\
    import contextlib

    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


    def accumulate(model: FSDP, body):
        with model.no_sync():
            body()


    def nested(model: FSDP, inner, after_inner):
        with model.no_sync():
            with model.no_sync():
                inner()
            after_inner()


    def stored(model: FSDP, body):
        pause = model.no_sync
        with contextlib.ExitStack() as stack:
            stack.enter_context(pause())
            body()


    def clip(model: FSDP):
        return model.clip_grad_norm_(1.0)


    def units(model: FSDP):
        return [id(unit) for unit in FSDP.fsdp_modules(model)]  # the list itself returned would stay (MF207)


    def roots(model: FSDP):
        return [id(unit) for unit in FSDP.fsdp_modules(model, root_only=True)]


    def rank0_state(model: FSDP):
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            return model.state_dict()


    def offloaded_state(model: FSDP):
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True)):
            return model.state_dict()
    '''
)


@pytest.fixture(scope="module")
def rewritten():
    result = rewrite_source(FSDP1_MODULE, "helpers.py")
    assert result.diagnostics == []
    module = types.ModuleType("rewritten_helpers")
    exec(compile(result.code, "rewritten_helpers.py", "exec"), module.__dict__)
    return result.code, module


class RecordingModule(FSDPModule):
    """Stands in for an FSDP2 module: records what gradient sync is set to."""

    def __new__(cls):  # FSDPModule's would build the class it was mixed into
        return object.__new__(cls)

    def __init__(self):
        self.sync = True
        self.seen = []

    def set_requires_gradient_sync(self, requires_gradient_sync):
        self.sync = requires_gradient_sync

    def note(self):
        self.seen.append(self.sync)


class OwnNoSync:
    """Stands in for a DDP model (or an FSDP1 one that stays): it has a no_sync of its own."""

    def __init__(self):
        self.inside = []

    @contextlib.contextmanager
    def no_sync(self):
        self.inside.append(True)
        yield
        self.inside.append(False)


def test_no_sync_leaves_a_module_fsdp2_did_not_shard_to_its_own_no_sync(rewritten):
    _, helpers = rewritten
    model = OwnNoSync()
    helpers.accumulate(model, lambda: model.inside.append("body"))
    assert model.inside == [True, "body", False]


def test_no_sync_turns_sync_off_inside_and_back_on_after(rewritten):
    _, helpers = rewritten
    model = RecordingModule()
    helpers.accumulate(model, model.note)
    assert model.seen == [False]
    assert model.sync is True


def test_nested_no_sync_keeps_sync_off_until_the_outer_block_ends(rewritten):
    _, helpers = rewritten
    model = RecordingModule()
    helpers.nested(model, model.note, model.note)
    assert model.seen == [False, False]
    assert model.sync is True


def test_no_sync_restores_sync_when_the_block_raises(rewritten):
    _, helpers = rewritten
    model = RecordingModule()

    def fail():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        helpers.accumulate(model, fail)
    assert model.sync is True
    with pytest.raises(RuntimeError, match="boom"), helpers.fsdp2_no_sync(model):
        with contextlib.suppress(RuntimeError), helpers.fsdp2_no_sync(model):
            fail()
        assert model.sync is False  # the inner block's exception left the outer setting alone
        fail()
    assert model.sync is True


def test_stored_bound_method_and_exit_stack(rewritten):
    _, helpers = rewritten
    model = RecordingModule()
    helpers.stored(model, model.note)
    assert model.seen == [False]
    assert model.sync is True


CHILD = textwrap.dedent(
    '''\
    import sys, types
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
    helpers = types.ModuleType("helpers")
    exec(open(sys.argv[1]).read(), helpers.__dict__)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (1,))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    assert helpers.units(model) == [id(model), id(model[0])]
    assert helpers.roots(model) == [id(model)]
    model(torch.ones(3, 4)).pow(2).sum().backward()
    expected = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in model.parameters()]))
    norm = helpers.clip(model)
    assert type(norm) is torch.Tensor and torch.allclose(norm, expected), (type(norm), norm, expected)
    # the same for a model of unknown origin (MF205's any-module helper)
    from migrate_fsdp.rewrite.helpers.fsdp2_module_clip_grad_norm_ import fsdp2_module_clip_grad_norm_
    model(torch.ones(3, 4)).pow(2).sum().backward()
    expected = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in model.parameters()]))
    norm = fsdp2_module_clip_grad_norm_(model, 0.5)
    assert type(norm) is torch.Tensor and torch.allclose(norm, expected), (type(norm), norm, expected)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.full_tensor().norm() for p in model.parameters()]))
    assert torch.allclose(clipped, torch.tensor(0.5), atol=1e-5) and expected > 0.5, (clipped, expected)
    for state in (helpers.rank0_state(model), helpers.offloaded_state(model)):
        assert state.keys() == reference.keys()
        for key, value in state.items():
            assert type(value) is torch.Tensor and value.device.type == "cpu", key
            assert torch.equal(value, reference[key]), key
    dist.destroy_process_group()
    print("ok")
    '''
)


def test_helpers_on_an_fsdp2_model(rewritten, tmp_path):
    code, _ = rewritten
    module = tmp_path / "helpers.py"
    module.write_text(code)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    done = subprocess.run(
        [sys.executable, str(child), str(module), str(tmp_path / "store")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]
