"""DCP's flattening of nested state dicts, to the letter, so keys match what dcp.load looks for.

dcp.save flattens `{"optimizer": {"state": {"w": {"exp_avg": t}}}}` into the key
`optimizer.state.w.exp_avg` (torch.distributed.checkpoint._traverse,
traverse_state_dict). Mappings are walked; a list is walked only if it holds a
tensor, a mapping or a non-terminal list, otherwise it is one value; tuples and
everything else are leaves; empty mappings vanish. `set_element` is the inverse
(DCP's own, used by dcp_to_torch_save).
"""

from collections.abc import Iterator, Mapping

from migrate_fsdp.convert_ckpt.errors import ConvertError
from migrate_fsdp.convert_ckpt.tensors import TensorRef

Path = tuple[str | int, ...]


def _is_terminal(value) -> bool:
    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    for entry in value:
        if isinstance(entry, (Mapping, list)) and not _is_terminal(entry):
            return False
        if isinstance(entry, TensorRef):
            return False
    return True


def flatten(state_dict: Mapping, unique: bool = True) -> Iterator[tuple[str, Path, object]]:
    """(flat key, path, leaf) for every leaf, in traversal order, generated as the walk goes (a checkpoint may hold a
    million leaves: their keys and paths are not all built at once unless the caller keeps them). `unique=False`
    skips the check that no two leaves flatten to one key, and the set of every key it keeps, for a tree already
    walked once."""
    seen: set[str] = set()

    def visit(path: Path, value):
        if isinstance(value, Mapping):
            for key, item in value.items():
                yield from visit(path + (str(key),), item)
        elif _is_terminal(value):
            key = ".".join(map(str, path))
            if unique:
                if key in seen:
                    raise ConvertError(f"two entries flatten to the same DCP key {key!r}")
                seen.add(key)
            yield key, path, value
        else:
            for index, item in enumerate(value):
                yield from visit(path + (index,), item)

    for key, value in state_dict.items():
        yield from visit((str(key),), value)


def set_element(root: dict, path: Path, value) -> None:
    """Put `value` at `path` in `root`, creating dicts (str keys) and lists (int keys) on the way."""
    container = root
    for previous, key in zip(path, path[1:]):
        default = {} if type(key) is str else []
        if isinstance(container, Mapping):
            container = container.setdefault(previous, default)
        else:
            container.extend([None] * (previous + 1 - len(container)))
            if container[previous] is None:
                container[previous] = default
            container = container[previous]
    key = path[-1]
    if type(key) is int:
        container.extend([None] * (key + 1 - len(container)))
    container[key] = value
