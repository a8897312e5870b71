"""An FSDP import another file takes from a rewritten module stays there: dropping it would break that file."""

from migrate_fsdp.rewrite.api import ParsedFile, rewrite_program
from migrate_fsdp.rewrite.selection import Selection

PACKAGE = b'''import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy


def wrap(net):
    return FSDP(net, device_id=torch.device("cpu"))
'''

# Names nothing rewrites: this file does not spell the FSDP package, so it is not even parsed.
CONSUMER = b'''from pkg import FSDP, wrap


def main(net):
    return wrap(net), FSDP
'''


def _rewrite(files):
    selection = Selection.from_prefixes(None, None)
    sources = dict(files)
    parsed = [ParsedFile(data, path, selection, True) for path, data in files.items()]
    return {r.path: r.new_source.decode() for r in rewrite_program(parsed, sources)}


def test_a_reexported_import_is_kept_and_the_rest_goes():
    out = _rewrite({"pkg/__init__.py": PACKAGE, "train.py": CONSUMER})
    package = out["pkg/__init__.py"]
    assert "fully_shard(net, mesh=mesh)" in package
    assert "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard\n" in package
    assert out["train.py"] == CONSUMER.decode()


def test_a_star_import_keeps_the_names_its_file_uses():
    out = _rewrite({"pkg/__init__.py": PACKAGE, "train.py": b"from pkg import *\n\nmodel = FSDP\n"})
    assert "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard\n" in out["pkg/__init__.py"]


def test_without_importers_the_unused_imports_go():
    out = _rewrite({"pkg/__init__.py": PACKAGE, "train.py": b"from pkg import wrap\n"})
    assert "FullyShardedDataParallel" not in out["pkg/__init__.py"]
    assert "from torch.distributed.fsdp import fully_shard\n" in out["pkg/__init__.py"]


def test_a_star_import_passes_names_on_only_where_they_are_taken():
    passes_on = b"from pkg import *\n"
    taken = {"pkg/__init__.py": PACKAGE, "utils/__init__.py": passes_on, "train.py": b"from utils import FSDP\n"}
    assert "FullyShardedDataParallel as FSDP, fully_shard\n" in _rewrite(taken)["pkg/__init__.py"]
    named_there = {"pkg/__init__.py": PACKAGE, "utils/__init__.py": passes_on + b"print(ShardingStrategy)\n"}
    assert "import ShardingStrategy, fully_shard\n" in _rewrite(named_there)["pkg/__init__.py"]
    untaken = {"pkg/__init__.py": PACKAGE, "utils/__init__.py": passes_on, "train.py": b"from utils import wrap\n"}
    assert "from torch.distributed.fsdp import fully_shard\n" in _rewrite(untaken)["pkg/__init__.py"]


def test_which_modules_other_files_import():
    from migrate_fsdp.rewrite.analysis.reexports import import_graph, imported_modules
    from migrate_fsdp.rewrite.analysis.remote_calls import RemoteCalls

    sources = {
        "app/__init__.py": b"",
        "app/a.py": b"import app.b as b\n",
        "app/c.py": b"from app import d\nfrom . import (\n    e,\n)\n",
        "app/b.py": b"",
        "app/d.py": b"",
        "app/e.py": b"",
        "app/f.py": b"from app.g import thing  # g, not f\n",
        "app/g.py": b"",
        "app/h.py": b"",  # only spelled in a string, by a file importing by strings
        "app/run.py": b"import importlib\n\nimportlib.import_module('app.h')\n",
        "app/alone.py": b"import torch\n",
    }
    found = imported_modules(import_graph(sources, RemoteCalls(sources)))
    assert found == {"app/__init__.py", "app/b.py", "app/d.py", "app/e.py", "app/g.py", "app/h.py"}
