"""Dropping the memo entries a pickle never reads back, so that unpickling a million tensors does not keep every
intermediate object alive until the end.

The unpickler keeps each object a PUT or MEMOIZE stores for as long as it runs. torch.save memoises about eight
objects per tensor (the persistent id, the storage key, the size and stride tuples, the rebuild arguments, an empty
OrderedDict...) and reads back only a handful of them (the "storage" and "cpu" strings, the globals). The pickle is
rewritten to store only the slots some GET reads, renumbered densely; FRAMEs go, since dropping bytes inside one
would break its length and unframed data is valid at every protocol. Nothing else changes: a slot no GET reads has
no effect but keeping its object alive. Pickles this does not expect (MEMOIZE mixed with explicit PUTs, a GET of a
slot not stored yet) are left as they are, for the unpickler to load or refuse as before.
"""

import pickle
import pickletools
import struct

from migrate_fsdp.convert_ckpt.errors import ConvertError

PUT_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
GET_OPS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def _indexed(short: bytes, long: bytes, index: int) -> bytes:
    return short + bytes((index,)) if index < 256 else long + struct.pack("<I", index)


def compact_memo(data: bytes, fetched: set[int], what: str) -> bytes:
    """`data` storing only the memo slots in `fetched` (the indices its GETs read), renumbered from 0."""
    out = bytearray()
    renumbered: dict[int, int] = {}
    copied = 0  # data[:copied] is written to `out` or left out on purpose
    pending = None  # what replaces the memo opcode met last, once the next opcode says where it ends
    memoised = 0  # MEMOIZE's implicit index
    explicit = False  # whether PUTs name their indices
    try:
        for opcode, arg, pos in pickletools.genops(data):
            if pending is not None:
                out += pending
                copied, pending = pos, None
            name = opcode.name
            if name in PUT_OPS or name == "MEMOIZE":
                if name == "MEMOIZE":
                    index, memoised = memoised, memoised + 1
                else:
                    index, explicit = arg, True
                if memoised and explicit:
                    return data
                out += data[copied:pos]
                pending = b""
                if index in fetched:
                    new = renumbered.setdefault(index, len(renumbered))
                    pending = pickle.MEMOIZE if name == "MEMOIZE" else _indexed(pickle.BINPUT, pickle.LONG_BINPUT, new)
            elif name in GET_OPS:
                if arg not in renumbered:
                    return data
                out += data[copied:pos]
                pending = _indexed(pickle.BINGET, pickle.LONG_BINGET, renumbered[arg])
            elif name == "FRAME":
                out += data[copied:pos]
                pending = b""
            elif name == "STOP":
                out += data[copied : pos + 1]
    except ValueError as error:
        raise ConvertError(f"{what} is truncated or corrupt: {error}") from None
    return bytes(out)
