"""A DCP metadata entry pickled once per shape is written as the same opcodes as pickling it each time."""

import functools
import io
import pickletools

from migrate_fsdp.convert_ckpt import dcp_format
from migrate_fsdp.convert_ckpt.dtypes import BY_NAME
from migrate_fsdp.convert_ckpt.pickling import Fragment, Pickler


def _opcodes(data: bytes) -> list:
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data) if op.name != "FRAME"]


def _dump(obj) -> tuple[bytes, Pickler]:
    buffer = io.BytesIO()
    pickler = Pickler(buffer, protocol=4, memo_globals_only=True)
    pickler.dump(obj)
    return buffer.getvalue(), pickler


def test_fragments_are_pickled_once_per_key_and_written_the_same():
    shapes = [(4,), (4,), (2, 3), (4,), (2, 3)]
    dtypes = [BY_NAME["float32"], BY_NAME["float32"], BY_NAME["bfloat16"], BY_NAME["float32"], BY_NAME["bfloat16"]]
    entries = [dcp_format.tensor_entry(d, s, [((0,) * len(s), s)]) for d, s in zip(dtypes, shapes)]
    fragments = [
        Fragment((d.name, s), functools.partial(dcp_format.tensor_entry, d, s, [((0,) * len(s), s)]))
        for d, s in zip(dtypes, shapes)
    ]
    plain, _ = _dump(entries)
    cached, pickler = _dump(fragments)
    assert _opcodes(cached) == _opcodes(plain)
    # the first entry of each dtype names new classes, so it is not kept; the second of each is, and then reused
    assert sorted(pickler._fragments) == [("bfloat16", (2, 3)), ("float32", (4,))]
