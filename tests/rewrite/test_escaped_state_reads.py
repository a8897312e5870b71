"""A model converting to FSDP2 that leaves the program's sight may have its state dict read anywhere: such reads on
receivers of unknown origin take the helper that gives FSDP1's full state dict for an FSDP2 module (FSDP2's own
`state_dict()` returns shards, and the checkpoint would silently change), files naming no FSDP included; an
optimizer's state dict is its own business and stays."""

from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

TRAINER = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


class Trainer:
    def __init__(self, net):
        self.model = FSDP(net, device_id=torch.device("cpu"))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
'''

MAIN = b'''import torch

from trainer import Trainer


def main(net):
    trainer = Trainer(net)
    torch.save({"model": trainer.model.state_dict(), "optim": trainer.optimizer.state_dict()}, "ckpt.pt")
'''

FACTORY = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def build_models(nets):
    models = {}
    for name, net in nets.items():
        models[name] = FSDP(net, device_id=torch.device("cpu"))
    return models


def save(nets, optimizer):
    models = build_models(nets)
    return {name: models[name].state_dict() for name in models}, optimizer.state_dict()
'''


def _rewrite(files):
    selection = Selection.from_prefixes(None, None)
    results = rewrite_program([ParsedFile(data, path, selection, True) for path, data in files.items()])
    return {r.path: r.new_source.decode() for r in results}


def test_a_model_stored_on_an_object_has_its_state_read_through_the_helper_in_a_file_naming_no_fsdp():
    out = _rewrite({"trainer.py": TRAINER, "main.py": MAIN})
    assert "fully_shard(net" in out["trainer.py"]
    assert '"model": fsdp2_state_dict(trainer.model)' in out["main.py"]
    assert '"optim": trainer.optimizer.state_dict()' in out["main.py"]


def test_a_model_kept_in_a_dict_a_factory_returns_has_its_state_read_through_the_helper():
    out = _rewrite({"build.py": FACTORY})["build.py"]
    assert "fully_shard(net" in out
    assert "{name: fsdp2_state_dict(models[name]) for name in models}, optimizer.state_dict()" in out


UNRELATED = b'''import torch


class Trainer:
    def save(self):
        torch.save(self.model.module.state_dict(), "ddp.pt")


if __name__ == "__main__":
    Trainer().save()
'''


def test_a_script_no_import_links_to_the_model_keeps_its_state_reads():
    """Examples side by side in one repository: the DDP tutorial's checkpoint shares no model with the FSDP one."""
    assert b"__main__" in UNRELATED  # a module without it may be imported by name (a library's config): it would take it
    files = {"fsdp/trainer.py": TRAINER, "fsdp/main.py": MAIN, "ddp/tutorial.py": UNRELATED}
    out = _rewrite(files)
    assert "fsdp2_state_dict(trainer.model)" in out["fsdp/main.py"]
    assert out["ddp/tutorial.py"] == UNRELATED.decode()


LIBRARY = b'''import torch


def build_net():
    return torch.nn.Linear(4, 4)
'''

SCRIPT_SHARING_A_LIBRARY = b'''import torch

from library import build_net


class Evaluator:
    def load(self, path):
        self.model.load_state_dict(torch.load(path))


if __name__ == "__main__":
    Evaluator().load("model.pt")
'''

TRAINER_USING_THE_LIBRARY = TRAINER.replace(b"import torch\n", b"import torch\n\nfrom library import build_net\n", 1)


def test_a_script_sharing_only_a_library_with_the_model_runs_apart_and_keeps_its_state_reads():
    """Both import `library`, neither imports the other: no process holds the trainer's model and runs the script."""
    files = {"trainer.py": TRAINER_USING_THE_LIBRARY, "main.py": MAIN, "library.py": LIBRARY, "evaluate.py": SCRIPT_SHARING_A_LIBRARY}
    out = _rewrite(files)
    assert "fsdp2_state_dict(trainer.model)" in out["main.py"]
    assert out["evaluate.py"] == SCRIPT_SHARING_A_LIBRARY.decode()


def test_a_module_imported_by_the_entry_point_running_the_model_takes_the_helper():
    """main.py runs the trainer's model and imports `checkpoint`: its reads may be of that model."""
    checkpoint = SCRIPT_SHARING_A_LIBRARY.replace(b"from library import build_net\n", b"").split(b"\n\n\nif __name__")[0] + b"\n"
    main = MAIN.replace(b"from trainer import Trainer\n", b"from checkpoint import Evaluator\nfrom trainer import Trainer\n")
    out = _rewrite({"trainer.py": TRAINER, "main.py": main, "checkpoint.py": checkpoint})
    assert "fsdp2_load_state_dict(self.model, torch.load(path))" in out["checkpoint.py"]


def test_a_module_no_file_imports_may_still_be_imported_by_name_and_takes_the_helper():
    """A callback module a library may load from a config: no import links it, yet it may run with the model."""
    callback = SCRIPT_SHARING_A_LIBRARY.split(b"\n\n\nif __name__")[0] + b"\n"
    out = _rewrite({"trainer.py": TRAINER, "main.py": MAIN, "callbacks.py": callback})
    assert "fsdp2_load_state_dict(self.model, torch.load(path))" in out["callbacks.py"]
