"""`--verify`: read what was written back through the format readers and compare it with the source, bit for bit.

Both sides are streamed in blocks (never a whole tensor in memory): dtype,
shape and every byte of every tensor, and the pickled value of every other
entry. Every mismatch is listed, not just the first.
"""

import numpy as np

from migrate_fsdp.convert_ckpt.fileio import iter_blocks
from migrate_fsdp.convert_ckpt.flatten import flatten
from migrate_fsdp.convert_ckpt.pickling import dumps
from migrate_fsdp.convert_ckpt.tensors import TensorRef

BLOCK = 8 << 20


def _fixed_blocks(tensor: TensorRef):
    """The tensor's bytes in blocks of exactly BLOCK bytes (the last shorter), whatever its segments."""
    pending = bytearray()
    for piece in iter_blocks(tensor.segments(), BLOCK):
        pending += piece
        while len(pending) >= BLOCK:
            yield bytes(pending[:BLOCK])
            del pending[:BLOCK]
    if pending:
        yield bytes(pending)


def compare_tensors(key: str, expected: TensorRef, actual: TensorRef) -> str | None:
    if expected.dtype != actual.dtype:
        return f"{key}: dtype {actual.dtype.name}, expected {expected.dtype.name}"
    if expected.shape != actual.shape:
        return f"{key}: shape {list(actual.shape)}, expected {list(expected.shape)}"
    itemsize = expected.dtype.itemsize
    differing, first, position = 0, None, 0
    for want, got in zip(_fixed_blocks(expected), _fixed_blocks(actual)):
        if want != got:
            unequal = (np.frombuffer(want, "u1") != np.frombuffer(got, "u1")).reshape(-1, itemsize).any(axis=1)
            if first is None:
                first = position // itemsize + int(np.argmax(unequal))
            differing += int(np.count_nonzero(unequal))
        position += len(want)
    if differing:
        return f"{key}: {differing} of {expected.numel} elements differ (first at flat index {first})"
    return None


def _compare(key: str, expected, actual, problems: list[str]) -> None:
    if isinstance(expected, TensorRef) or isinstance(actual, TensorRef):
        if not (isinstance(expected, TensorRef) and isinstance(actual, TensorRef)):
            problems.append(f"{key}: {type(actual).__name__}, expected {type(expected).__name__}")
            return
        problem = compare_tensors(key, expected, actual)
        if problem:
            problems.append(problem)
        return
    if isinstance(expected, (tuple, list)) and type(expected) is type(actual) and len(expected) == len(actual):
        for index, (want, got) in enumerate(zip(expected, actual)):
            _compare(f"{key}[{index}]", want, got, problems)
        return
    if dumps(expected)[0] != dumps(actual)[0]:
        problems.append(f"{key}: value {actual!r}, expected {expected!r}")


def compare_trees(expected: dict, actual: dict, where: str) -> list[str]:
    want = {key: value for key, _, value in flatten(expected)}
    got = {key: value for key, _, value in flatten(actual)}
    problems = [f"{where}: {key}: missing" for key in want if key not in got]
    problems += [f"{where}: {key}: unexpected" for key in got if key not in want]
    for key in want.keys() & got.keys():
        _compare(f"{where}: {key}", want[key], got[key], problems)
    return sorted(problems)
