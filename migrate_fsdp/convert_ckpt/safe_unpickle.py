"""A restricted unpickler: checkpoints are read without running code from them.

A pickle runs code only through the globals it names (the callables REDUCE
calls, the classes BUILD fills); every global goes through `find_class`, so an
explicit allow-list decides what can run. Allowed: the tensor rebuild
functions of torch.save (answered by stand-ins that record a byte range,
never by torch), containers, and a few harmless types real checkpoints carry
(argparse.Namespace, numpy arrays and scalars, pathlib paths, datetimes).
Anything else is refused by name before a single opcode runs: `scan_globals`
reads the opcodes without executing them, so the error can list every
offending global, and known non-FULL checkpoints (ShardedTensor, DTensor,
quantized or sparse tensors) get a specific refusal instead.
"""

import _compat_pickle
import functools
import importlib
import io
import pickle
import pickletools

from migrate_fsdp.convert_ckpt.dtypes import BY_NAME, BY_STORAGE, QUANTIZED_STORAGES
from migrate_fsdp.convert_ckpt.errors import ConvertError, Refused, UnsafePickle
from migrate_fsdp.convert_ckpt.pickle_memo import GET_OPS, PUT_OPS, compact_memo
from migrate_fsdp.convert_ckpt.pickling import GlobalRef, Reduced, TorchSize
from migrate_fsdp.convert_ckpt.tensors import StoredTensor

STDLIB_ALLOWED = {
    "collections": {"OrderedDict", "Counter", "defaultdict", "deque"},
    "builtins": set("set frozenset bytearray bytes complex slice range list dict tuple int float str bool".split()),
    "_codecs": {"encode"},
    "argparse": {"Namespace"},
    "pathlib": {"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath"},
    "datetime": {"datetime", "date", "time", "timedelta", "timezone"},
}
NUMPY_ALLOWED = {
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
}
_MODULE_CLASSES = ("torch.nn.modules.", "torch.nn.parallel.", "torch.distributed.fsdp.")
_TORCH_VALUES = {"Tensor", "contiguous_format", "channels_last", "channels_last_3d", "preserve_format", "strided"}

SHARDED_TENSOR = "torch.distributed._shard.sharded_tensor"
_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")
_UNSUPPORTED_TENSORS = {
    "_rebuild_qtensor": "quantized",
    "_rebuild_sparse_tensor": "sparse",
    "_rebuild_sparse_csr": "sparse",
    "_rebuild_nested_tensor": "nested",
    "_rebuild_meta_tensor_no_storage": "meta (data-less)",
    "_rebuild_device_tensor_from_numpy": "device (numpy-backed)",
    "_rebuild_xla_tensor": "XLA",
    "_rebuild_mtia_tensor": "MTIA",
    "_rebuild_wrapper_subclass": "tensor-subclass",
}


def canonical(module: str, name: str) -> tuple[str, str]:
    """Python 3 names for the Python 2 spellings protocol-2 pickles use (`__builtin__`, `copy_reg`)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


_STRING_OPS = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"}


def scan_globals(data: bytes, what: str) -> tuple[set[str], set[str], set[int]]:
    """The globals a pickle names, the strings it holds that name flat parameters and the memo slots its GETs read,
    from its opcodes without running it.

    STACK_GLOBAL takes its module and name from the two strings pushed just
    before it, fresh or fetched from the memo, so the memo is tracked for strings
    (only for strings: a pickle of a million tensors memoises millions of objects).
    """
    names, flat_params, fetched, memo = set(), set(), set(), {}
    pushed: tuple = (None, None)  # the last two strings pushed
    memoised = 0  # MEMOIZE's implicit index
    last = None  # the string the previous opcode pushed, if it pushed one
    try:
        for opcode, arg, _ in pickletools.genops(data):
            op = opcode.name
            if op in ("GLOBAL", "INST"):
                names.add(".".join(canonical(*arg.split(" ", 1))))
                last = None
            elif op == "STACK_GLOBAL":
                if pushed[0] is not None:
                    names.add(".".join(canonical(*pushed)))
                last = None
            elif op in _STRING_OPS:
                last = arg if isinstance(arg, str) else arg.decode("latin-1")
                if last.endswith("flat_param"):
                    flat_params.add(last)
                pushed = (pushed[1], last)
            elif op in GET_OPS:
                fetched.add(arg)
                last = memo.get(arg)
                if last is not None:
                    pushed = (pushed[1], last)
            elif op in PUT_OPS:
                if last is not None:
                    memo[arg] = last
            elif op == "MEMOIZE":
                if last is not None:
                    memo[memoised] = last
                memoised += 1
            elif op not in ("FRAME", "PROTO"):
                last = None
    except ValueError as error:
        raise ConvertError(f"{what} is truncated or corrupt: {error}") from None
    return names, flat_params, fetched


def refuse_non_full(names: set[str], flat_params: set[str], what: str) -> None:
    """Refuse the checkpoints that are not FULL_STATE_DICT, recognised by the globals they name."""
    if any(n.startswith(SHARDED_TENSOR) for n in names):
        if flat_params:
            raise Refused(
                f"{what} is an FSDP1 LOCAL_STATE_DICT (1-D flat-parameter shards of one rank): it cannot be "
                "unflattened without the FSDP1 model; load it into the FSDP1 model and save a FULL_STATE_DICT, "
                "or a SHARDED_STATE_DICT with torch.distributed.checkpoint"
            )
        raise Refused(
            f"{what} holds ShardedTensor values (an FSDP1 SHARDED_STATE_DICT saved with torch.save): save it with "
            "torch.distributed.checkpoint (dcp.save) from every rank instead; FSDP2 loads that directly"
        )
    if any(n.startswith(_DTENSOR_MODULES) for n in names):
        raise Refused(
            f"{what} holds DTensor values (a sharded FSDP2/tensor-parallel state dict saved with torch.save): "
            "save it with dcp.save from every rank, or gather it with get_model_state_dict(..., "
            "options=StateDictOptions(full_state_dict=True)) before torch.save"
        )
    for name in names:
        module, _, attr = name.rpartition(".")
        if module == "torch._utils" and attr in _UNSUPPORTED_TENSORS:
            if attr == "_rebuild_wrapper_subclass":
                continue  # reported at load time with the subclass name
            raise Refused(f"{what} holds {_UNSUPPORTED_TENSORS[attr]} tensors, which convert-ckpt does not convert")
        if module == "torch" and attr in QUANTIZED_STORAGES:
            raise Refused(f"{what} holds quantized tensors, which convert-ckpt does not convert")


def check_allowed(names: set[str], allow_unsafe: bool, what: str, also_allowed=frozenset()) -> None:
    if allow_unsafe:
        return
    unsafe = [n for n in names if n not in also_allowed and not is_allowed(n)]
    modules = sorted(n for n in unsafe if n.startswith(_MODULE_CLASSES))
    if modules:  # torch.save(model): --unsafe-pickle would only get as far as "not a state dict"
        raise Refused(
            f"{what} holds pickled nn.Modules ({', '.join(modules[:3])}{', ...' if len(modules) > 3 else ''}), "
            "as torch.save(model) writes, not a state dict: save model.state_dict() (and the optimizer state) "
            "in a dict instead"
        )
    if unsafe:
        raise UnsafePickle(unsafe)


def is_allowed(name: str) -> bool:
    module, _, attr = name.rpartition(".")
    if attr in STDLIB_ALLOWED.get(module, ()) or name in NUMPY_ALLOWED:
        return True
    if module == "numpy.dtypes" and attr.endswith("DType"):
        return True
    return _torch_global(module, attr) is not None


class _StorageType:
    def __init__(self, dtype):
        self.dtype = dtype  # None for UntypedStorage (bytes)


class _Storage:
    """A storage of the file being read: its bytes and, for typed storages, its dtype."""

    def __init__(self, storage, dtype):
        self.storage, self.dtype = storage, dtype


# The tensor rebuilders get `shapes`, the unpickler's table of the shape and stride tuples met so far, so that the
# tensors of one shape share one tuple (a model repeats a few shapes; a million tensors would otherwise hold two
# tuples each).


def _rebuild_tensor_v2(
    storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None, *, shapes=None
):
    if metadata:
        raise Refused("a tensor has its conj/neg bit set; save t.resolve_conj().resolve_neg() instead")
    if storage.dtype is None:
        raise ConvertError("corrupt checkpoint: an untyped storage rebuilt without a dtype")
    return StoredTensor(storage.dtype, size, storage.storage, storage_offset, stride, shapes)


def _rebuild_tensor(storage, storage_offset, size, stride, *, shapes=None):
    return _rebuild_tensor_v2(storage, storage_offset, size, stride, shapes=shapes)


def _rebuild_tensor_v3(
    storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype, metadata=None, *, shapes=None
):
    if metadata:
        raise Refused("a tensor has its conj/neg bit set; save t.resolve_conj().resolve_neg() instead")
    dtype = BY_NAME.get(getattr(dtype, "name", None))
    if dtype is None:
        raise Refused(f"a tensor has dtype {dtype!r}, which convert-ckpt does not convert")
    return StoredTensor(dtype, size, storage.storage, storage_offset, stride, shapes)


_TENSOR_REBUILDERS = {_rebuild_tensor, _rebuild_tensor_v2, _rebuild_tensor_v3}


def _rebuild_parameter(data, requires_grad, backward_hooks, state=None):
    return data


def _rebuild_from_type_v2(func, new_type, args, state):
    if new_type not in (GlobalRef("torch", "Tensor"), GlobalRef("torch.nn.parameter", "Parameter")):
        raise Refused(f"a tensor is a {new_type!r}; save plain tensors (t.detach().clone()) instead")
    return func(*args)  # python attributes of the tensor (FSDP1's _has_been_cloned) are dropped


def _rebuild_device_tensor_from_cpu_tensor(data, dtype, device, requires_grad):
    return data


def _unsupported(kind):
    def refuse(*args):
        raise Refused(f"the checkpoint holds {kind} tensors, which convert-ckpt does not convert")

    return refuse


def _reduced(module, name):
    ref = GlobalRef(module, name)
    return lambda *args: Reduced(ref, args)


_TORCH_FUNCTIONS = {
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._utils", "_rebuild_device_tensor_from_cpu_tensor"): _rebuild_device_tensor_from_cpu_tensor,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Size"): lambda values=(): TorchSize(values),
    ("torch", "device"): _reduced("torch", "device"),
    ("torch.serialization", "_get_layout"): _reduced("torch.serialization", "_get_layout"),
    ("torch.torch_version", "TorchVersion"): str,
    ("torch.nn.parameter", "Parameter"): GlobalRef("torch.nn.parameter", "Parameter"),
}


def _torch_global(module: str, name: str):
    """The stand-in for an allowed torch global, None when it is not allowed."""
    if (module, name) in _TORCH_FUNCTIONS:
        return _TORCH_FUNCTIONS[(module, name)]
    if module == "torch._utils" and name in _UNSUPPORTED_TENSORS:
        return _unsupported(_UNSUPPORTED_TENSORS[name])
    if module == "torch" and name in BY_STORAGE:
        return _StorageType(BY_STORAGE[name])
    if (module, name) in (("torch", "UntypedStorage"), ("torch.storage", "UntypedStorage")):
        return _StorageType(None)
    if module == "torch" and (name in BY_NAME or name in _TORCH_VALUES):
        return GlobalRef(module, name)
    return None


def import_global(module: str, name: str):
    if module.startswith("numpy.") and "multiarray" in module:
        # numpy 2 moved numpy.core to numpy._core; pickles name either
        for candidate in (
            module,
            module.replace("numpy.core", "numpy._core"),
            module.replace("numpy._core", "numpy.core"),
        ):
            try:
                return getattr(importlib.import_module(candidate), name)
            except (ImportError, AttributeError):
                continue
    return getattr(importlib.import_module(module), name)


class SafeUnpickler(pickle.Unpickler):
    """Unpickles a torch.save data.pkl into plain containers with `StoredTensor` leaves.

    `storage(key, dtype)` returns the bytes of a storage record (a FileStorage).
    """

    def __init__(self, data: bytes, storage, allow_unsafe: bool = False, extra_globals=None):
        super().__init__(io.BytesIO(data))
        self._storage = storage
        self._allow_unsafe = allow_unsafe
        self._extra = extra_globals or {}
        self._shapes: dict[tuple, tuple] = {}

    def find_class(self, module, name):
        module, name = canonical(module, name)
        if (module, name) in self._extra:
            return self._extra[(module, name)]
        stand_in = _torch_global(module, name)
        if stand_in in _TENSOR_REBUILDERS:
            return functools.partial(stand_in, shapes=self._shapes)
        if stand_in is not None:
            return stand_in
        if (
            name in STDLIB_ALLOWED.get(module, ())
            or f"{module}.{name}" in NUMPY_ALLOWED
            or (module == "numpy.dtypes" and name.endswith("DType"))
            or self._allow_unsafe
        ):
            return import_global(module, name)
        raise UnsafePickle([f"{module}.{name}"])

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise ConvertError(f"corrupt checkpoint: unknown persistent id {pid!r}")
        storage_type, key = pid[1], pid[2]
        if not isinstance(storage_type, _StorageType):
            raise ConvertError(f"corrupt checkpoint: {storage_type!r} is not a storage type")
        return _Storage(self._storage(str(key), storage_type.dtype), storage_type.dtype)


def vet_pickle(data: bytes, what: str, allow_unsafe: bool = False, extra_globals=None) -> set[int]:
    """Raise the refusals and unsafe globals of a pickle from its opcodes alone, before anything runs; returns the
    memo slots its GETs read.

    `extra_globals` maps (module, name) to stand-ins allowed for this pickle only
    (the DCP metadata classes); such a pickle is metadata, not a checkpoint, and
    is not classified.
    """
    names, flat_params, fetched = scan_globals(data, what)
    if extra_globals is None:
        refuse_non_full(names, flat_params, what)
    check_allowed(names, allow_unsafe, what, {f"{m}.{n}" for m, n in (extra_globals or {})})
    return fetched


def unpickle(data: bytes, storage, what: str, allow_unsafe: bool = False, extra_globals=None):
    """Vet, then load, a checkpoint's pickle (see vet_pickle for `extra_globals`), keeping only the memo slots it
    reads back (see pickle_memo)."""
    data = compact_memo(data, vet_pickle(data, what, allow_unsafe, extra_globals), what)
    try:
        return SafeUnpickler(data, storage, allow_unsafe, extra_globals).load()
    except ConvertError:
        raise
    except Exception as error:  # a malformed pickle fails in many ways; all of them mean "corrupt"
        raise ConvertError(f"{what}: cannot unpickle: {type(error).__name__}: {error}") from None
