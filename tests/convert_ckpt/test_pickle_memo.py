"""The unpickler keeps only the memo slots a pickle reads back, and what it loads is unchanged."""

import collections
import pickle
import pickletools
import zipfile

import pytest
import torch

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.pickle_memo import PUT_OPS, compact_memo
from migrate_fsdp.convert_ckpt.read_torch import read_torch_zip
from migrate_fsdp.convert_ckpt.safe_unpickle import SafeUnpickler, scan_globals, unpickle
from migrate_fsdp.convert_ckpt.tensors import FileStorage, StoredTensor


def _stores(data: bytes) -> int:
    return sum(op.name in PUT_OPS or op.name == "MEMOIZE" for op, _, _ in pickletools.genops(data))


def _shared_value():
    shared = [1.5, "twice"]
    return {"a": shared, "b": shared, "c": collections.OrderedDict(x=(shared, "twice")), "big": list(range(300))}


@pytest.mark.parametrize("protocol", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_only_the_fetched_slots_are_stored_and_the_value_is_the_same(protocol):
    value = _shared_value()
    data = pickle.dumps(value, protocol=protocol)
    fetched = scan_globals(data, "test")[2]
    assert fetched and _stores(data) > len(fetched)
    compact = compact_memo(data, fetched, "test")
    assert _stores(compact) == len(fetched)
    loaded = pickle.loads(compact)
    assert loaded == value
    assert loaded["a"] is loaded["b"] is loaded["c"]["x"][0]


def test_a_torch_checkpoint_keeps_a_handful_of_slots_whatever_its_size(tmp_path):
    path = tmp_path / "many.pt"
    torch.save({"model": {f"w{i}": torch.full((2,), float(i)) for i in range(300)}}, path)
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    fetched = scan_globals(data, "test")[2]
    assert _stores(data) > 300 * 5 and len(fetched) < 10
    unpickler = SafeUnpickler(compact_memo(data, fetched, "test"), lambda key, dtype: FileStorage("x", 0, 8))
    tree = unpickler.load()
    assert len(unpickler.memo.copy()) == len(fetched)
    assert list(tree["model"]) == [f"w{i}" for i in range(300)]
    assert all(isinstance(t, StoredTensor) and t.shape == (2,) for t in tree["model"].values())
    assert read_torch_zip(str(path))["model"]["w7"].storage.nbytes == 8


def test_a_get_of_a_slot_not_stored_yet_is_left_to_the_unpickler():
    data = pickle.PROTO + b"\x02" + pickle.BINGET + b"\x00" + pickle.STOP
    assert compact_memo(data, {0}, "test") == data
    with pytest.raises(ConvertError, match="cannot unpickle"):
        unpickle(data, None, "test")


def test_memoize_mixed_with_explicit_puts_is_left_as_it_is():
    data = (
        pickle.PROTO + b"\x04" + pickle.EMPTY_LIST + pickle.MEMOIZE + pickle.EMPTY_LIST + pickle.BINPUT + b"\x05"
        + pickle.APPEND + pickle.BINGET + b"\x05" + pickle.APPEND + pickle.STOP
    )
    assert compact_memo(data, {5}, "test") == data
    loaded = unpickle(data, None, "test")
    assert loaded == [[]] * 2 and loaded[0] is loaded[1]
