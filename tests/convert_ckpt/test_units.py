"""The format pieces checked against torch's own implementations of the same rules."""

import argparse
import collections
import copy
import io
import pathlib
import pickle
import zipfile

import numpy as np
import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import _flatten_optim_state_dict

from migrate_fsdp.convert_ckpt import cast, zipfmt
from migrate_fsdp.convert_ckpt.detect import read_source
from migrate_fsdp.convert_ckpt.dtypes import BY_NAME
from migrate_fsdp.convert_ckpt.fileio import OutputFile
from migrate_fsdp.convert_ckpt.flatten import flatten
from migrate_fsdp.convert_ckpt.safe_unpickle import canonical, scan_globals
from migrate_fsdp.convert_ckpt.structure import flatten_optim, unflatten_optim
from migrate_fsdp.convert_ckpt.tensors import ChunkedTensor, FileStorage, StoredTensor
from migrate_fsdp.convert_ckpt.write_torch import write_archive
from tests.convert_ckpt.helpers import full_checkpoint, same


def _as_refs(tree):
    """The same tree with each torch tensor replaced by a tensor reference (what the readers produce)."""
    if isinstance(tree, torch.Tensor):
        return StoredTensor(BY_NAME["float32"], tree.shape, FileStorage("unused", 0, tree.numel() * 4))
    if isinstance(tree, dict):
        return {k: _as_refs(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_as_refs(v) for v in tree]
    return tree


def test_flatten_is_dcps():
    tree = {
        "model": {"w": torch.ones(2)},
        "rng": [torch.ones(1), torch.ones(1)],
        "nested": [[torch.ones(1)], [1, 2], {"a": 1}],
        "groups": [{"lr": 0.1, "params": ["w"]}],
        "betas": (0.9, torch.ones(1)),
        "empty": {},
        "nothing": [],
        "plain": [1, "x"],
    }
    theirs, mapping = flatten_state_dict(tree)
    ours = list(flatten(_as_refs(tree)))
    assert [key for key, _, _ in ours] == list(theirs)
    assert {key: path for key, path, _ in ours} == mapping


def test_optimizer_flattening_is_torchs():
    nested = full_checkpoint()["optimizer"]
    assert same(_flatten_optim_state_dict(copy.deepcopy(nested)), flatten_optim(nested)) == []
    assert same(nested, unflatten_optim(flatten_optim(nested), list(nested["state"]))) == []


def test_cast_block_by_block_is_tensor_to(tmp_path, monkeypatch):
    monkeypatch.setattr(cast, "BLOCK", 64)  # many blocks for a small tensor
    values = torch.randn(37, 5) * 1000
    path = tmp_path / "raw"
    path.write_bytes(values.numpy().tobytes())
    source = StoredTensor(BY_NAME["float32"], values.shape, FileStorage(str(path), 0, values.nbytes))
    for target, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        got = b"".join(bytes(s) for s in cast.CastTensor(source, BY_NAME[target]).segments())
        assert got == values.to(dtype).view(torch.uint8).numpy().tobytes()


def test_chunks_that_are_not_rows_are_reassembled(tmp_path):
    full = np.arange(24, dtype=np.int32).reshape(4, 6)
    path = tmp_path / "chunks"
    left, right = np.ascontiguousarray(full[:, :4]), np.ascontiguousarray(full[:, 4:])
    path.write_bytes(left.tobytes() + right.tobytes())
    dtype = BY_NAME["int32"]
    tensor = ChunkedTensor(
        dtype,
        (4, 6),
        [
            ((0, 4), StoredTensor(dtype, (4, 2), FileStorage(str(path), left.nbytes, right.nbytes))),
            ((0, 0), StoredTensor(dtype, (4, 4), FileStorage(str(path), 0, left.nbytes))),
        ],
    )
    assert b"".join(bytes(s) for s in tensor.segments()) == full.tobytes()
    assert b"".join(bytes(s) for s in tensor.segments((1, 3))) == full[1:3].tobytes()


def test_zip64_records_are_read_by_torch_and_zipfile(tmp_path, monkeypatch):
    monkeypatch.setattr(zipfmt, "ZIP64_LIMIT", 0)  # every size and offset takes the >4 GB path
    source = full_checkpoint(epoch=1)
    torch.save(source, tmp_path / "in.pt")
    tree = read_source(str(tmp_path / "in.pt"), False).tree
    with OutputFile(tmp_path / "out.pt") as out:
        write_archive(out, tree)
    assert same(source, torch.load(tmp_path / "out.pt", weights_only=True)) == []
    assert "archive/data.pkl" in zipfile.ZipFile(tmp_path / "out.pt").namelist()
    assert same(source, _reload(tmp_path / "out.pt")) == []


def _reload(path):
    """Our own reader on our own output, written back through torch for comparison."""
    tree = read_source(str(path), False).tree
    with OutputFile(str(path) + ".again") as out:
        write_archive(out, tree)
    return torch.load(str(path) + ".again", weights_only=True)


class _Recorder(pickle.Unpickler):
    def __init__(self, data):
        super().__init__(io.BytesIO(data))
        self.names = set()

    def find_class(self, module, name):
        self.names.add(".".join(canonical(module, name)))
        return super().find_class(module, name)


def test_scan_finds_the_globals_unpickling_looks_up():
    value = {
        "ns": argparse.Namespace(a=1),
        "od": collections.OrderedDict(b=[1, 2]),
        "again": argparse.Namespace(),
        "path": pathlib.PurePosixPath("/x"),
        "array": np.arange(3),
        "set": {1, 2},
        "bytes": b"\x00\x01",
    }
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        data = pickle.dumps(value, protocol=protocol)
        recorder = _Recorder(data)
        recorder.load()
        assert scan_globals(data, "test")[0] == recorder.names, protocol
