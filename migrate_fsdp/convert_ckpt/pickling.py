"""Writing pickles that name torch (and DCP) classes without importing them.

The standard pickler looks a class up by importing its module, which would
cost the seconds of `import torch` and `torch.distributed.checkpoint`. The
stand-ins here carry a global's module and name instead; `Pickler` writes them
as the same opcodes the real objects produce, so torch reads the result as if
torch had written it. Tensors become `torch._utils._rebuild_tensor_v2`
(or `_v3` for dtypes without a typed storage) over a persistent storage id,
exactly as torch.save writes them.
"""

import collections
import io
import pickle
from dataclasses import dataclass

from migrate_fsdp.convert_ckpt.tensors import TensorRef, contiguous_strides


@dataclass(frozen=True)
class GlobalRef:
    """A module-level name (a class, a function, a dtype) referred to by name."""

    module: str
    name: str

    def __call__(self, *args):  # the pickler requires reduce functions to be callable
        raise TypeError(f"{self.module}.{self.name} is a stand-in and cannot be called")

    def __repr__(self):
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Reduced:
    """`func(*args)` (then BUILD `state` when not None): torch.device("cuda", 0), an enum member..."""

    func: GlobalRef
    args: tuple
    state: object = None

    def __repr__(self):
        return f"{self.func!r}{self.args!r}"


class TorchSize(tuple):
    """torch.Size: a tuple that pickles as torch.Size."""


@dataclass(eq=False)
class NewObj:
    """An instance of `cls` rebuilt by NEWOBJ then BUILD `state`: how dataclasses pickle (DCP metadata)."""

    cls: GlobalRef
    state: object


class DeferredDict:
    """A dict pickled from `items()` as they are generated, never built whole: DCP metadata is a dozen small objects
    per tensor, and a checkpoint of a million tiny tensors must not hold them all at once (with `memo_globals_only`,
    each is freed as soon as it is written)."""

    __slots__ = ("items",)

    def __init__(self, items):
        self.items = items  # a function returning an iterator of (key, value)


class Fragment:
    """`build()`, pickled once for all fragments of an equal `key` and written again as the same bytes (with
    `memo_globals_only`, once the classes it names are memoised, its pickle no longer depends on where it goes):
    a million tensors of a few shapes have a few different DCP metadata entries."""

    __slots__ = ("key", "build")

    def __init__(self, key, build):
        self.key, self.build = key, build


FRAGMENTS_KEPT = 4096  # distinct fragments remembered; a checkpoint of more shapes pickles the others each time

TORCH_UTILS = "torch._utils"


def dtype_ref(dtype) -> GlobalRef:
    return GlobalRef("torch", dtype.name)


@dataclass
class StorageSlot:
    """One storage record of the archive being written: the tensor whose elements fill it."""

    key: str
    tensor: TensorRef


class Pickler(pickle._Pickler):
    """Pure-Python pickler (its save_global can be overridden) that writes stand-ins by name.

    Tensors met on the way become storages of the archive; `storages` lists
    them in the order their records must be written. Tensors that are the same
    view of the same source storage (tied weights) share one storage, as
    torch.save would have them.
    """

    dispatch = pickle._Pickler.dispatch.copy()

    def __init__(self, file, protocol=2, memo_globals_only=False):
        super().__init__(file, protocol=protocol)
        self.storages: list[StorageSlot] = []
        self._by_identity: dict = {}
        # The memo keeps every object it has seen alive, a few hundred bytes each: for DCP metadata, dozens of small
        # objects per tensor. There nothing needs sharing but the class names, memoised by value instead.
        self._memo_globals_only = memo_globals_only
        self._globals: dict[GlobalRef, int] = {}
        self._fragments: dict = {}

    def memoize(self, obj):
        if not self._memo_globals_only or isinstance(obj, GlobalRef):
            super().memoize(obj)

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, TensorRef):
            return self._save_tensor(obj)
        return super().save(obj, save_persistent_id)

    def persistent_id(self, obj):
        if isinstance(obj, StorageSlot):
            tensor = obj.tensor
            if tensor.dtype.storage:
                storage = GlobalRef("torch", tensor.dtype.storage)
            else:
                storage = GlobalRef("torch.storage", "UntypedStorage")
            numel = tensor.numel if tensor.dtype.storage else tensor.nbytes
            return ("storage", storage, obj.key, "cpu", numel)
        return None

    def _save_tensor(self, tensor: TensorRef) -> None:
        identity = getattr(tensor, "identity", None)
        slot = self._by_identity.get(identity) if identity is not None else None
        if slot is None:
            slot = StorageSlot(str(len(self.storages)), tensor)
            self.storages.append(slot)
            if identity is not None:
                self._by_identity[identity] = slot
        args = (slot, 0, TorchSize(tensor.shape), contiguous_strides(tensor.shape), False, collections.OrderedDict())
        if tensor.dtype.storage:
            self.save_reduce(GlobalRef(TORCH_UTILS, "_rebuild_tensor_v2"), args)
        else:
            self.save_reduce(GlobalRef(TORCH_UTILS, "_rebuild_tensor_v3"), (*args, dtype_ref(tensor.dtype)))

    def save_global(self, obj, name=None):
        if not isinstance(obj, GlobalRef):
            return super().save_global(obj, name)
        if obj in self._globals:
            self.write(self.get(self._globals[obj]))
            return
        if self.proto >= 4:
            self.save(obj.module)
            self.save(obj.name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
        if self._memo_globals_only:
            self._globals[obj] = len(self.memo)
        self.memoize(obj)

    dispatch[GlobalRef] = save_global

    def _save_reduced(self, obj: Reduced):
        self.save_reduce(obj.func, tuple(obj.args), obj.state, obj=obj)

    dispatch[Reduced] = _save_reduced

    def _save_size(self, obj: TorchSize):
        self.save_reduce(GlobalRef("torch", "Size"), (tuple(obj),), obj=obj)

    dispatch[TorchSize] = _save_size

    def _save_newobj(self, obj: NewObj):
        self.save(obj.cls)
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        if obj.state is not None:
            self.save(obj.state)
            self.write(pickle.BUILD)

    dispatch[NewObj] = _save_newobj

    def _save_deferred_dict(self, obj: DeferredDict):
        self.write(pickle.EMPTY_DICT)
        batch = 0
        for key, value in obj.items():
            if batch == 0:
                self.write(pickle.MARK)
            self.save(key)
            self.save(value)
            batch += 1
            if batch == self._BATCHSIZE:
                self.write(pickle.SETITEMS)
                batch = 0
        if batch:
            self.write(pickle.SETITEMS)

    dispatch[DeferredDict] = _save_deferred_dict

    def _save_fragment(self, obj: Fragment):
        data = self._fragments.get(obj.key)
        if data is None:
            named = len(self._globals)
            buffer, write = io.BytesIO(), self.write
            self.write = buffer.write
            try:
                self.save(obj.build())
            finally:
                self.write = write
            data = buffer.getvalue()
            if self._memo_globals_only and len(self._globals) == named and len(self._fragments) < FRAGMENTS_KEPT:
                self._fragments[obj.key] = data
        self.write(data)

    dispatch[Fragment] = _save_fragment


def dumps(obj, protocol=2) -> tuple[bytes, list[StorageSlot]]:
    """The pickle of `obj` and the storages (tensors) it refers to."""
    buffer = io.BytesIO()
    pickler = Pickler(buffer, protocol=protocol)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.storages
