"""Two training scripts of one repository that do not import each other run in separate processes: a model that
stays FSDP1 in one and leaves the program's sight (to a library) cannot meet the other's model, which converts
(LLaMA2-Accessory's Large-DiT-ImageNet and Large-DiT-T2I side by side). A module both import still joins them."""

from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

STAYING = b'''import diffusion
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def main(net):
    model = FSDP(net, device_id=torch.device("cpu"))
    print(model._handle)
    diffusion.train(model)


if __name__ == "__main__":
    main(torch.nn.Linear(4, 4))
'''

CONVERTING = b'''import diffusion
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def setup(net) -> FSDP:
    return FSDP(net, device_id=torch.device("cpu"))


def main(net):
    diffusion.train(setup(net))


if __name__ == "__main__":
    main(torch.nn.Linear(4, 4))
'''

SHARED = b'''from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def unwrap(model):
    return model.module if isinstance(model, FSDP) else model
'''


def _rewrite(files):
    selection = Selection.from_prefixes(None, None)
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()])
    return {r.path: r.new_source.decode() for r in results}


def test_a_model_staying_in_another_script_holds_nothing_back():
    out = _rewrite({"imagenet/train.py": CONVERTING, "t2i/train.py": STAYING})
    assert "fully_shard(net" in out["imagenet/train.py"] and "-> FSDPModule" in out["imagenet/train.py"]
    assert "FSDP(net" in out["t2i/train.py"]


def test_scripts_importing_one_module_may_meet_there():
    importing = b"from shared import unwrap\n" + CONVERTING.replace(b"diffusion.train(setup(net))", b"diffusion.train(unwrap(setup(net)))")
    staying = b"from shared import unwrap\n" + STAYING.replace(b"diffusion.train(model)", b"diffusion.train(unwrap(model))")
    out = _rewrite({"imagenet/train.py": importing, "t2i/train.py": staying, "shared.py": SHARED})
    assert "FSDP(net" in out["t2i/train.py"] and "FSDP(net" in out["imagenet/train.py"]


DIT_TRAIN = b'''import diffusion
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from grad_norm import grad_norm


def setup_fsdp_sync(net) -> FSDP:
    return FSDP(net, device_id=torch.device("cpu"))


def main(net):
    model = setup_fsdp_sync(net)  # other ranks get the weights in setup_fsdp_sync
    print(f"model:\\n{model}")
    diffusion.train(model)
    print(grad_norm(model))


if __name__ == "__main__":
    main(torch.nn.Linear(4, 4))
'''

SQUARES = b'''import torch
import torch.distributed as dist


def grad_norm(model):
    norm_sq = torch.zeros(())
    for p in model.parameters():
        norm_sq += p.grad.norm() ** 2
    dist.all_reduce(norm_sq)
    return norm_sq.sqrt()
'''


PARAMETER_SQUARES = b'''

def param_norm(model):
    squares = sum(p.pow(2).sum() for p in model.parameters())
    dist.all_reduce(squares)
    return squares.sqrt()
'''


def test_programs_side_by_side_with_modules_of_one_name_convert_apart():
    """Lumina-T2X's shape: directories of one repository, each a program of a `train.py` script and a `grad_norm.py`
    it imports from its own directory, each script defining a factory of the same name. Where one directory's norm
    stays FSDP1 (not a sum over elements), its model stays; the other's converts, though its model leaves sight (to a
    library), for a module outside any package in another directory runs only with its own scripts."""
    files = {
        "a/train.py": DIT_TRAIN,
        "a/grad_norm.py": SQUARES,
        "b/train.py": DIT_TRAIN,
        "b/grad_norm.py": SQUARES.replace(b".norm() ** 2", b".norm()") + PARAMETER_SQUARES,
    }
    out = _rewrite(files)
    assert "fully_shard(net" in out["a/train.py"]
    assert "p.grad.to_local().norm() ** 2" in out["a/grad_norm.py"]
    assert "FSDP(net" in out["b/train.py"]
    assert "TODO(migrate-fsdp): MF216" in out["b/grad_norm.py"]
    assert "fsdp2_local" not in out["b/grad_norm.py"]  # no converting model reaches it: its sums stay as they were
