"""Global hooks that watch a training script it did not write, one optimizer step at a time.

Loss: the scalar handed to `torch.autograd.backward` (what `loss.backward()`
calls), summed over the backward calls since the previous optimizer step. A
step: one `step()` of any optimizer, seen through torch.optim's global step
pre/post hooks, so a script that trains several models (or a GAN's two
optimizers) is followed step by step; the FSDP units are found the first time
each optimizer steps, among the models that own its parameters. The time of
the probe's own work is taken out of the step times, and its temporary
tensors out of the memory peaks (the peak is read before that work and reset
after it).
"""

import contextlib
import time
import warnings
import weakref

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

from migrate_fsdp.verify.sharding import dtype_name, find_units, global_stats

NONDETERMINISM_WARNING = "does not have a deterministic implementation"
# CPU memory is accounted op by op, which slows a step down (about 2x on small
# models, more for FSDP2's many per-parameter ops). The first step creates the
# optimizer state and the second shows the steady state, so the accounting
# stops after those two and the later steps are timed without it.
CPU_MEMORY_STEPS = 2


class StopTraining(BaseException):
    """Raised from the optimizer post-hook after the last step asked for.

    A BaseException, so that a script's `except Exception` does not swallow it.
    """


class CudaMeter:
    def __init__(self, device):
        self.device = device

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return torch.cuda.memory_stats(self.device)["active_bytes.all.peak"]

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)


class CpuMeter:
    def __init__(self, tracker):
        self.tracker = tracker

    def reset(self) -> None:
        self.tracker.reset_peak()

    def peak(self) -> int:
        return self.tracker.peak

    def sync(self) -> None:
        pass

    def stop(self) -> bool:
        """End the accounting (only if no mode of the script's sits above it); True if it ended."""
        if _get_current_dispatch_mode() is not self.tracker:
            return False
        self.tracker.__exit__(None, None, None)
        return True


class NullMeter:
    """No peak to read: CPU accounting has ended, or a script keeps its parameters on the CPU beside a GPU."""

    def reset(self) -> None:
        pass

    def peak(self) -> None:
        return None

    def sync(self) -> None:
        pass


class _Optimizer:
    """What the probe knows about one optimizer of the script."""

    def __init__(self, index: int, optimizer):
        self.index = index
        seen, self.params = set(), []
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) not in seen:
                    seen.add(id(param))
                    self.params.append(param)
        self.units = find_units(self.params)


class Recorder:
    def __init__(self, writer, max_steps: int | None, cpu_tracker=None, perturbation=None):
        self.writer = writer
        self.perturbation = perturbation  # a control run's (perturb.Perturbation), else None
        self.max_steps = max_steps
        self.cpu_tracker = cpu_tracker
        self.meter = CpuMeter(cpu_tracker) if cpu_tracker is not None else None
        self.steps_done = 0
        self.nondeterministic_ops = set()
        # optimizer -> _Optimizer; weak, since a later optimizer may reuse a freed one's id()
        self._optimizers = weakref.WeakKeyDictionary()
        self._optimizer_count = 0
        self._skipped = set()
        self._unsynced_depth = 0  # open FSDP1 no_sync() blocks
        self._fsdp2_sync_off = weakref.WeakKeyDictionary()  # FSDPModule -> set_requires_gradient_sync(False)
        self._losses = []
        self._backwards = 0
        self._unsynced_backwards = 0
        self._clip = None
        self._in_clip = False
        self._step_start = time.perf_counter()
        self._own_time = 0.0
        self._step_peak = 0
        self._pending = {}
        self._forward_handle = None

    # -- installation -------------------------------------------------------

    def install(self) -> None:
        import torch.nn.utils as nn_utils
        import torch.nn.utils.clip_grad as clip_grad
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

        register_optimizer_step_pre_hook(self._pre_step)
        register_optimizer_step_post_hook(self._post_step)
        self._forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(self._first_forward)
        original_backward = torch.autograd.backward

        def backward(tensors, *args, **kwargs):
            self._on_backward(tensors)
            return original_backward(tensors, *args, **kwargs)

        torch.autograd.backward = backward
        clip = self._wrap_clip(nn_utils.clip_grad_norm_)
        nn_utils.clip_grad_norm_ = clip_grad.clip_grad_norm_ = clip
        FSDP1.clip_grad_norm_ = self._wrap_clip(FSDP1.clip_grad_norm_)
        FSDP1.no_sync = self._wrap_no_sync(FSDP1.no_sync)
        FSDPModule.set_requires_gradient_sync = self._wrap_set_sync(FSDPModule.set_requires_gradient_sync)
        original_showwarning = warnings.showwarning

        def showwarning(message, *args, **kwargs):
            if NONDETERMINISM_WARNING in str(message):
                self.nondeterministic_ops.add(str(message).split(" does not")[0])
            return original_showwarning(message, *args, **kwargs)

        warnings.showwarning = showwarning

    def _wrap_clip(self, clip):
        def wrapper(*args, **kwargs):
            if self._in_clip:  # FSDP1's method calls torch's for NO_SHARD
                return clip(*args, **kwargs)
            self._in_clip = True
            try:
                total = clip(*args, **kwargs)
            finally:
                self._in_clip = False
            max_norm = kwargs["max_norm"] if "max_norm" in kwargs else args[1]
            value = total.full_tensor() if hasattr(total, "full_tensor") else total
            self._clip = {"total_norm": float(value), "max_norm": float(max_norm), "dtype": dtype_name(value.dtype)}
            return total

        return _like(wrapper, clip)

    def _wrap_no_sync(self, no_sync):
        @contextlib.contextmanager
        def wrapper(module):
            with no_sync(module):
                self._unsynced_depth += 1
                try:
                    yield
                finally:
                    self._unsynced_depth -= 1

        return _like(wrapper, no_sync)

    def _wrap_set_sync(self, set_sync):
        from torch.distributed.fsdp import FSDPModule

        def wrapper(module, requires_gradient_sync, *, recurse=True):
            for target in module.modules() if recurse else [module]:
                if isinstance(target, FSDPModule):
                    self._fsdp2_sync_off[target] = not requires_gradient_sync
            return set_sync(module, requires_gradient_sync, recurse=recurse)

        return _like(wrapper, set_sync)

    # -- hooks ---------------------------------------------------------------

    def _first_forward(self, module, args):
        self._forward_handle.remove()
        if self.meter is None:  # a GPU is visible: measure on the device the model runs on
            device = next((p.device for p in module.parameters() if p.device.type == "cuda"), None)
            self.meter = CudaMeter(device) if device is not None else None
        self._start_step()

    def _start_step(self) -> None:
        if self.meter is not None:
            self.meter.sync()
            self.meter.reset()
        self._own_time = 0.0
        self._step_start = time.perf_counter()

    def _on_backward(self, tensors) -> None:
        started = time.perf_counter()
        self._backwards += 1
        if self._unsynced_depth or any(self._fsdp2_sync_off.values()):
            self._unsynced_backwards += 1
        loss = tensors[0] if isinstance(tensors, (tuple, list)) and len(tensors) == 1 else tensors
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._losses.append(loss.detach())
        self._own_time += time.perf_counter() - started

    def _is_state_init(self, optimizer) -> bool:
        """torch.distributed.checkpoint's `_init_optim_state`: a step with lr 0 on zero gradients, no training."""
        return self._backwards == 0 and all(float(group.get("lr", 1.0)) == 0.0 for group in optimizer.param_groups)

    def _pre_step(self, optimizer, args, kwargs):
        if self._is_state_init(optimizer):
            self._skipped.add(id(optimizer))
            return
        started = time.perf_counter()
        known = self._optimizers.get(optimizer)
        if known is None:
            with _disable_current_modes():
                known = self._optimizers[optimizer] = _Optimizer(self._optimizer_count, optimizer)
            self._optimizer_count += 1
            self._setup(known, optimizer)
        self.meter.sync()
        self._step_peak = self.meter.peak()
        with _disable_current_modes():
            if self.perturbation is not None:
                clipped = bool(self._clip and self._clip["total_norm"] > self._clip["max_norm"])
                self.perturbation.apply(known.params, self.steps_done, clipped, lambda: global_stats(
                    known.params, known.units.primary, use_grads=True)[0])
            grad_norm, grad_digest, numel = global_stats(known.params, known.units.primary, use_grads=True)
            losses = [float(loss) for loss in self._losses]
            self._pending = {
                "optimizer": known.index,
                "loss": sum(losses) if losses else None,
                "loss_abs": sum(abs(loss) for loss in losses),
                "loss_dtype": dtype_name(self._losses[0].dtype) if losses else None,
                "backwards": self._backwards,
                "unsynced_backwards": self._unsynced_backwards,
                "grad_norm": grad_norm,
                "grad_digest": grad_digest,
                "grad_numel": numel,
                "clip": self._clip,
            }
        self.meter.reset()
        self._own_time += time.perf_counter() - started

    def _post_step(self, optimizer, args, kwargs):
        if id(optimizer) in self._skipped:
            self._skipped.discard(id(optimizer))
            return
        self.meter.sync()
        ended = time.perf_counter()
        peak = self.meter.peak()
        if peak is not None:
            peak = max(self._step_peak, peak)
        known = self._optimizers[optimizer]
        with _disable_current_modes():
            param_norm, param_digest, numel = global_stats(known.params, known.units.primary, use_grads=False)
        self.writer.write(
            "step",
            step=self.steps_done,
            **self._pending,
            param_norm=param_norm,
            param_digest=param_digest,
            param_numel=numel,
            time_s=ended - self._step_start - self._own_time,
            peak_bytes=peak,
            instrumented=isinstance(self.meter, CpuMeter),
        )
        self.steps_done += 1
        self._losses, self._backwards, self._unsynced_backwards, self._clip = [], 0, 0, None
        if self.steps_done == CPU_MEMORY_STEPS and isinstance(self.meter, CpuMeter) and self.meter.stop():
            self.meter = NullMeter()
        if self.max_steps and self.steps_done >= self.max_steps:
            raise StopTraining
        self._start_step()

    def _setup(self, known: _Optimizer, optimizer) -> None:
        device = next((p.device for p in known.params if p.device.type == "cuda"), None)
        if self.meter is None:  # a GPU is visible, and no forward has shown where the model runs
            self.meter = CudaMeter(device) if device is not None else NullMeter()
        self.writer.write(
            "setup",
            optimizer_index=known.index,
            optimizer=type(optimizer).__name__,
            device=device.type if device is not None else "cpu",
            backend=str(dist.get_backend()),
            world_size=dist.get_world_size(),
            units=known.units.settings,
            deterministic=torch.are_deterministic_algorithms_enabled(),
        )

    def close(self) -> None:
        """End CPU memory accounting if it is still running."""
        if isinstance(self.meter, CpuMeter):
            self.meter.stop()

    def finish(self) -> dict:
        """What the end record says about the run beyond its status."""
        return {"steps": self.steps_done, "nondeterministic_ops": sorted(self.nondeterministic_ops)}


def _like(wrapper, wrapped):
    wrapper.__wrapped__ = wrapped
    wrapper.__name__ = wrapped.__name__
    wrapper.__qualname__ = wrapped.__qualname__
    wrapper.__doc__ = wrapped.__doc__
    return wrapper
