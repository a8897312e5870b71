"""A model handed to a function of another module: resolved to that file, followed there, tied to its FSDP1 code."""

from migrate_fsdp.rewrite.analysis.escapes import Remote
from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls
from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

TRAIN = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from pkg.loop import train_epoch


def main(module, batches):
    model = FSDP(module, device_id=torch.device("cpu"))
    train_epoch(model, batches)
'''

LOOP = b'''def train_epoch(model, batches):
    for batch in batches[:-1]:
        with model.no_sync():
            model(batch).sum().backward()
    model(batches[-1]).sum().backward()
    %s
'''

# A use nobody can trace that stays FSDP1: it holds back every model that may reach it.
LEGACY = b'''from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save_local(model):
    with FSDP.summon_full_params(model):
        return {name: p.clone() for name, p in model.named_parameters()}, model
'''

CALLS_LEGACY = b"from pkg.legacy import save_local\n\nsave_local(object())\n"


def _rewrite(files):
    selection = Selection.from_prefixes(None, None)
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()])
    return {r.path: r.new_source.decode() for r in results}


def test_a_model_handed_to_another_module_converts_with_the_fsdp1_code_there():
    loop = LOOP.replace(b"    for batch", b"    if cfg.enable_fsdp:\n        for batch").replace(b"\n        with", b"\n            with")
    loop = loop.replace(b"\n            model(batch)", b"\n                model(batch)").replace(b"(model, batches)", b"(model, batches, cfg)")
    train = TRAIN.replace(b"train_epoch(model, batches)", b"train_epoch(model, batches, cfg)").replace(b"batches):", b"batches, cfg):")
    out = _rewrite({"pkg/train.py": train, "pkg/loop.py": loop % b"", "pkg/legacy.py": LEGACY, "run.py": CALLS_LEGACY})
    assert "fully_shard(module" in out["pkg/train.py"]
    assert "fsdp2_no_sync(model)" in out["pkg/loop.py"]


DDP_RUN = b"from torch.nn.parallel import DistributedDataParallel as DDP\n\n\ndef wrap(module):\n    return DDP(module)\n"


def test_no_sync_on_a_model_of_unknown_origin_serves_ddp_and_fsdp2_alike():
    """`model.no_sync()` on a parameter nothing says is FSDP's, in a program that also uses DDP (which has it
    too): the helper calls DDP's own no_sync for a DDP model, so the call converts and holds nothing back. Without
    FSDP1 models that convert, it stays reported."""
    out = _rewrite({"pkg/train.py": TRAIN, "pkg/loop.py": LOOP % b"", "pkg/ddp.py": DDP_RUN})
    assert "fully_shard(module" in out["pkg/train.py"]
    assert "fsdp2_no_sync(model)" in out["pkg/loop.py"]
    kept = _rewrite({"pkg/train.py": TRAIN.replace(b"FSDP(module,", b"FSDP(module, sync_module_states=True, param_init_fn=lambda m: m.reset_parameters(), device_mesh=mesh,"), "pkg/loop.py": LOOP % b"", "pkg/ddp.py": DDP_RUN})
    assert "model.no_sync()" in kept["pkg/loop.py"]


def test_in_a_program_where_nothing_else_has_no_sync_an_unknown_receiver_is_an_fsdp1_model():
    out = _rewrite({"pkg/train.py": TRAIN, "pkg/loop.py": LOOP % b""})
    assert "fully_shard(module" in out["pkg/train.py"]
    assert "fsdp2_no_sync(model)" in out["pkg/loop.py"]


def test_a_model_the_other_module_hands_on_out_of_sight_stays():
    loop = LOOP % b"external.register(model)"
    files = {"pkg/train.py": TRAIN, "pkg/loop.py": b"import external\n" + loop, "pkg/legacy.py": LEGACY, "run.py": CALLS_LEGACY}
    out = _rewrite(files)
    assert "FSDP(module" in out["pkg/train.py"] and "fully_shard" not in out["pkg/train.py"]
    assert "model.no_sync()" in out["pkg/loop.py"]


def test_a_function_that_stays_fsdp1_there_holds_the_model_back():
    loop = LOOP.replace(b"def train_epoch", LEGACY.split(b"\n\n\n")[1] + b"\n\n\ndef train_epoch") % b"save_local(model)"
    files = {"pkg/train.py": TRAIN, "pkg/loop.py": LEGACY.split(b"\n\n\n")[0] + b"\n\n\n" + loop}
    out = _rewrite(files)
    assert "fully_shard" not in out["pkg/train.py"]


def test_resolution_prefers_the_callers_directory_and_follows_relative_imports():
    sources = {
        "a/fp8_utils.py": b"def evaluate(model):\n    return model(1)\n",
        "b/fp8_utils.py": b"def evaluate(model):\n    return model(1)\n",
        "b/pkg/__init__.py": b"",
        "b/pkg/steps.py": b"def step(model):\n    model.helper(model)\n",
    }
    calls = RemoteCalls(sources)
    assert calls.reach("b/fsdp.py", Remote("fp8_utils.evaluate", 0, None))[0] == "b/fp8_utils.py"
    assert calls.reach("c/fsdp.py", Remote("fp8_utils.evaluate", 0, None)) is None  # two candidates, neither nearer
    assert calls.reach("b/pkg/train.py", Remote(".steps.step", 0, None)) is None  # handed on to a method: out of sight
    assert calls.reach("b/pkg/train.py", Remote(".steps.step", None, "model")) is None
    assert calls.reach("b/pkg/train.py", Remote(".missing.step", 0, None)) is None


FACTORY = b'''import functools

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp.wrap import ModuleWrapPolicy


def save(model):
    if isinstance(model, FSDP):
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            return model.state_dict()
    return model.state_dict()


def main():
    wrapper = functools.partial(FSDP, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), device_id=torch.device("cpu"))
    model = wrapper(torch.nn.Linear(4, 4))
    return save(model)
'''

KEEPS_FSDP1 = b'''from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from train import save


def build(module, pick, name):
    return save(FSDP(module, **pick(name)))
'''


def test_the_model_a_factory_makes_is_followed_where_it_goes():
    """A model from `wrapper(net)` handed to `save`: its FSDP1 code converts with the factory, or both stay."""
    alone = _rewrite({"train.py": FACTORY})["train.py"]
    assert "fully_shard" in alone and "isinstance(model, FSDPModule)" in alone
    together = _rewrite({"train.py": FACTORY, "other.py": KEEPS_FSDP1})["train.py"]
    assert "fully_shard" not in together and "isinstance(model, FSDP):" in together


SETUP = b"from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n\ndef setup_fsdp(model):\n    return FSDP(model)\n"
CLIPS = b"import torch\nfrom wrap import setup_fsdp\n\nmodel = setup_fsdp(torch.nn.Linear(2, 2))\nmodel.clip_grad_norm_(1.0)\n"


def test_clipping_in_a_file_that_names_no_fsdp_is_never_left_silently():
    """The model comes from another module's wrapper: the call converts with it, in a program with DDP too (the
    program traces the model to the wrapper); it was left as is while the wrapper converted."""
    for files in ({"wrap.py": SETUP, "train.py": CLIPS, "ddp.py": DDP_RUN}, {"wrap.py": SETUP, "train.py": CLIPS}):
        converted = _rewrite(files)
        assert "fully_shard(model)" in converted["wrap.py"]
        assert "clip_grad_norm_(model.parameters(), 1.0)" in converted["train.py"]


COMMON = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def setup_model():
    return FSDP(torch.nn.Linear(4, 1), device_id=torch.device("cpu"))


def build():
    model = setup_model()
    return model
'''
TRAINS = b"import torch\n\nfrom common import setup_model\n\nmodel = setup_model()\nmodel.clip_grad_norm_(1.0)\n"


def test_a_factorys_model_is_followed_to_its_callers_in_files_naming_no_fsdp():
    """`export.py` names no FSDP and reads FSDP1's `world_size` on the model `setup_model()` returns: an
    AttributeError on an FSDP2 model, so the factory stays FSDP1 (it converted, with the read left, before)."""
    export = b"from common import build\n\nmodel = build()\nprint(model.world_size)\n"
    held = _rewrite({"common.py": COMMON, "train.py": TRAINS, "export.py": export})
    assert "return FSDP(" in held["common.py"] and "model.clip_grad_norm_(1.0)" in held["train.py"]
    assert held["export.py"] == export.decode()
    export = b"import torch\n\nfrom common import build\n\nmodel = build()\nprint(model(torch.ones(1, 4)))\n"
    converted = _rewrite({"common.py": COMMON, "train.py": TRAINS, "export.py": export})
    assert "fully_shard(" in converted["common.py"] and "clip_grad_norm_(model.parameters(), 1.0)" in converted["train.py"]


def test_an_fsdp1_read_is_found_where_the_model_also_goes_out_of_sight():
    """open_lm's shape: the model is handed to a helper of its file loading a state dict no rule took for FSDP1's
    (`assign=True`: no helper makes that call for FSDP2), and to a library: the read holds the model FSDP1 whatever
    else it reaches (it was lost once). Without `assign`, the helper serves it and the model converts."""
    source = b'''import torch
import wandb
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def load(model, sd):
    model.load_state_dict(sd, assign=True)


def main(sd):
    model = FSDP(torch.nn.Linear(2, 2))
    load(model, sd)
    wandb.watch(model)
'''
    assert "model = FSDP(torch.nn.Linear(2, 2))" in _rewrite({"train.py": source})["train.py"]
    converted = _rewrite({"train.py": source.replace(b", assign=True", b"")})["train.py"]
    assert "model = fully_shard(torch.nn.Linear(2, 2))" in converted and "fsdp2_load_state_dict(model, sd)" in converted


HELPERS = b"def describe(model):\n    return type(model.module).__name__\n"


def test_a_decorated_function_taking_the_model_hides_no_read_elsewhere():
    """held-out round 13: `@torch.no_grad()` (followed into) or `@functools.lru_cache()` (out of sight) on another
    function taking the model lost the `model.module` read of helpers.py, and the model converted with it left."""
    for decorator in (b"@torch.no_grad()", b"@functools.lru_cache()"):
        train = b'''import functools

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from helpers import describe


%s
def evaluate(model):
    return model(torch.ones(2, 4)).sum().item()


def main():
    model = FSDP(torch.nn.Linear(4, 4), device_id=torch.device("cpu"))
    print(describe(model), evaluate(model))
''' % decorator
        out = _rewrite({"train.py": train, "helpers.py": HELPERS})
        assert "model = FSDP(torch.nn.Linear(4, 4)" in out["train.py"], decorator


EXPORT_SCRIPT = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def dump(model):
    with FSDP.summon_full_params(model):
        print(model.weight.sum())


if __name__ == "__main__":
    dump(torch.load("model.pt"))
'''

TRAIN_SCRIPT = b'''import torch
import wandb
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def main():
    model = FSDP(torch.nn.Linear(2, 2))
    wandb.watch(model)


if __name__ == "__main__":
    main()
'''


def test_a_model_out_of_sight_meets_no_use_in_a_script_nothing_imports():
    """LLaMA2-Accessory's shape: a model handed to a library converts although another entry script keeps FSDP1 code
    on a model of unknown origin, which out-of-sight code cannot call without importing that script; once a file
    imports the script, the library may reach its code, and the model stays."""
    converted = _rewrite({"train.py": TRAIN_SCRIPT, "export.py": EXPORT_SCRIPT})
    assert "fully_shard(torch.nn.Linear(2, 2))" in converted["train.py"]
    assert "FSDP.summon_full_params(model)" in converted["export.py"]
    importer = b"from export import dump\n"
    held = _rewrite({"train.py": TRAIN_SCRIPT, "export.py": EXPORT_SCRIPT, "tools.py": importer})
    assert "model = FSDP(torch.nn.Linear(2, 2))" in held["train.py"]


def test_deciding_again_for_a_file_naming_no_fsdp_keeps_what_the_first_decision_adopted():
    """The checkpoint module names no FSDP, so the program parses it late and decides a second time; the loop's
    `model.no_sync()` on a model of unknown origin, taken for the FSDP1 model's in a program nothing else gives that
    method, must convert in that second decision too (else the model converts and its no_sync stays)."""
    files = {
        "train.py": b"import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n\n"
        b"from ckpt import save\nfrom loop import step\n\n\ndef main():\n"
        b"    model = FSDP(torch.nn.Linear(2, 2))\n    step(model)\n    save(model)\n",
        "loop.py": b"def step(model):\n    with model.no_sync():\n        model(1).sum().backward()\n",
        "ckpt.py": b"import torch\n\n\ndef save(model):\n    torch.save(model.state_dict(), 'm.pt')\n",
    }
    converted = _rewrite(files)
    assert "fully_shard(torch.nn.Linear(2, 2))" in converted["train.py"]
    assert "with fsdp2_no_sync(model):" in converted["loop.py"]
    assert "torch.save(fsdp2_state_dict(model), 'm.pt')" in converted["ckpt.py"]


GROUPS = b'''def add_weight_decay(model, weight_decay):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if name.endswith(".bias"):
            no_decay.append(param)
        else:
            decay.append(param)
    return [{"params": no_decay, "weight_decay": 0.0}, {"params": decay, "weight_decay": weight_decay}]
'''


def test_parameter_names_of_a_model_from_elsewhere_change_only_where_a_converting_model_had_flat_ones():
    """Lumina-mGPT's no-decay groups, in a module that sees no constructor: FSDP1 named each parameter where every
    model that converts was built with use_orig_params=True, so the test picks what it picked (not reported);
    with one built without it, FSDP1 had named flat parameters there (MF215)."""
    train = TRAIN.replace(b"from pkg.loop import train_epoch\n", b"from pkg.groups import add_weight_decay\nfrom pkg.loop import train_epoch\n")
    train = train.replace(b"    train_epoch(model, batches)", b"    add_weight_decay(model, 0.1)\n    train_epoch(model, batches)")
    orig = train.replace(b'device_id=torch.device("cpu")', b'device_id=torch.device("cpu"), use_orig_params=True')
    quiet = _rewrite({"pkg/train.py": orig, "pkg/loop.py": LOOP % b"", "pkg/groups.py": GROUPS})
    assert "TODO" not in quiet["pkg/groups.py"]
    assert "fully_shard(module" in quiet["pkg/train.py"]
    flat = _rewrite({"pkg/train.py": train, "pkg/loop.py": LOOP % b"", "pkg/groups.py": GROUPS})
    assert "MF215" in flat["pkg/groups.py"]
    unreached = _rewrite({"pkg/train.py": TRAIN, "pkg/loop.py": LOOP % b"", "pkg/groups.py": GROUPS})
    assert "TODO" not in unreached["pkg/groups.py"]  # no model reaches it: nothing changes there


MIXED_PRECISION = b'''import torch


def prepare(params, dtype):
    with torch.no_grad():
        for p in params:
            p.data = p.data.to(dtype)
'''


def test_parameters_handed_to_another_modules_function_take_its_model_along():
    """mistral-finetune's hand-made mixed precision swaps `p.data` of the parameters handed in: the model whose
    parameters reach it stays FSDP1 (FSDP2 keeps its own shards). Parameters handed to a function out of the
    program's sight (a library's optimizer) hold nothing back."""
    train = TRAIN.replace(b"from pkg.loop import train_epoch\n", b"from pkg.loop import train_epoch\nfrom pkg.mp import prepare\n")
    swapped = train.replace(b"    train_epoch(model, batches)", b"    prepare(model.parameters(), torch.bfloat16)\n    train_epoch(model, batches)")
    out = _rewrite({"pkg/train.py": swapped, "pkg/loop.py": LOOP % b"", "pkg/mp.py": MIXED_PRECISION})
    assert "MF217" in out["pkg/mp.py"]
    assert "FSDP(module" in out["pkg/train.py"] and "fully_shard" not in out["pkg/train.py"]
    library = train.replace(b"from pkg.mp import prepare\n", b"import bitsandbytes as bnb\n").replace(
        b"    train_epoch(model, batches)", b"    bnb.optim.AdamW8bit(model.parameters())\n    train_epoch(model, batches)"
    )
    out = _rewrite({"pkg/train.py": library, "pkg/loop.py": LOOP % b""})
    assert "fully_shard(module" in out["pkg/train.py"]


def test_a_function_a_package_re_exports_resolves_to_its_definition():
    """`from recipe.utils import hsdp_device_mesh` of llama-recipes: the package's `__init__` re-exports it from
    a module of its own; the call runs that module's function."""
    sources = {
        "recipe/utils/__init__.py": b"from recipe.utils.fsdp_utils import hsdp_device_mesh as hsdp_device_mesh\n",
        "recipe/utils/fsdp_utils.py": b"def hsdp_device_mesh(replicas, shards):\n    return None\n",
        "recipe/train.py": b"from recipe.utils import hsdp_device_mesh\n\nmesh = hsdp_device_mesh(1, 2)\n",
    }
    path, function = RemoteCalls(sources).called("recipe/train.py", "recipe.utils.hsdp_device_mesh")
    assert (path, function.name.value) == ("recipe/utils/fsdp_utils.py", "hsdp_device_mesh")
    assert RemoteCalls(sources).called("recipe/train.py", "recipe.utils.missing") is None
