"""The CPU tensor-memory account: allocations, frees, resize_ (how FSDP frees unsharded parameters)."""

import torch

from migrate_fsdp.verify.cpu_memory import StorageTracker


def test_counts_live_storages_and_the_peak():
    tracker = StorageTracker()
    with tracker:
        a = torch.zeros(1000)  # 4000 B
        b = a + 1  # 8000 B live
        del b
        assert tracker.current == 4000
        tracker.reset_peak()
        c = torch.ones(10, 10, dtype=torch.float64)  # 800 B
        view = c[0]  # no new storage
        assert tracker.current == 4800 and tracker.peak == 4800
        del a, c, view
    assert tracker.current == 0
    assert tracker.peak == 4800


def test_follows_storage_resize():
    tracker = StorageTracker()
    with tracker:
        t = torch.empty(256)
        t.untyped_storage().resize_(0)
        assert tracker.current == 0
        t.untyped_storage().resize_(4096)
        assert tracker.current == 4096
        del t
    assert tracker.current == 0
    assert torch.UntypedStorage.resize_ is tracker._orig_resize  # restored on exit


def test_counts_autograd_buffers_created_in_backward():
    tracker = StorageTracker()
    weight = torch.randn(64, 64, requires_grad=True)
    with tracker:
        (weight @ weight).sum().backward()
        assert tracker.peak >= 64 * 64 * 4 * 2  # the product and the gradient
