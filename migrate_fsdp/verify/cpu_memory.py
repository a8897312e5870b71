"""Peak CPU tensor memory per training step, for runs without a GPU.

CPU tensors have no allocator statistics, so this counts bytes the way
`torch.distributed._tools.mem_tracker.MemTracker` does: a dispatch mode sees
every storage an op creates, a weak reference notices when it dies, and
`UntypedStorage.resize_` (which FSDP1 and FSDP2 use to free and re-allocate
unsharded parameters) is wrapped. MemTracker itself also keeps per-module
snapshots and refuses repeated forwards without a reset, which a training loop
it did not write cannot arrange; only the byte count is needed here.
"""

import weakref

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


class StorageTracker(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self._sizes = WeakIdKeyDictionary()  # storage -> [bytes counted for it]
        self.current = 0
        self.peak = 0
        self._orig_resize = torch.UntypedStorage.resize_

    def reset_peak(self) -> None:
        self.peak = self.current

    def _count(self, storage: torch.UntypedStorage) -> None:
        if storage.device.type != "cpu" or storage in self._sizes:
            return
        counted = [storage.nbytes()]
        self._sizes[storage] = counted
        self._add(counted[0])
        weakref.finalize(storage, self._release, weakref.ref(self), counted)

    @staticmethod
    def _release(tracker_ref, counted) -> None:
        tracker = tracker_ref()
        if tracker is not None:
            tracker.current -= counted[0]

    def _add(self, nbytes: int) -> None:
        self.current += nbytes
        if self.current > self.peak:
            self.peak = self.current

    def _track(self, tensor: torch.Tensor) -> None:
        if type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter:
            self._count(tensor.untyped_storage())
        else:
            for storage in get_untyped_storages(tensor):
                self._count(storage)

    def __enter__(self):
        tracker = self
        orig_resize = self._orig_resize

        def resize_(storage, size):
            result = orig_resize(storage, size)
            counted = tracker._sizes.get(storage)
            if counted is not None:
                delta = storage.nbytes() - counted[0]
                counted[0] += delta
                tracker._add(delta)
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if DTensor in types:
            return NotImplemented  # let DTensor unwrap; its local ops come back here
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self._track(out)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, torch.Tensor):
                    self._track(item)
        return out
