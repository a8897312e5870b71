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
