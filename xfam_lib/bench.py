"""Timing and peak memory on any device.

`time_fn` reports the median of repeats after warm-up (synchronising CUDA). `peak_memory`
uses the CUDA allocator's statistics on a GPU and, on a CPU, counts the bytes of the tensors
created while the function runs (a dispatch-level tracker: exact for tensor storage, blind to
allocator overhead and to memory outside torch).
"""
from __future__ import annotations

import statistics
import time
import weakref
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["time_fn", "peak_memory"]


def _sync(device: torch.device | str | None) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1,
            device: torch.device | str | None = None) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class _LiveTensorBytes(TorchDispatchMode):
    """Tracks the bytes of storages created by ops while active, and their peak."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        if key in self._storages:
            self._storages.discard(key)
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and key not in self._storages:
                    self._storages.add(key)
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    weakref.finalize(t, self._release, key, nbytes)
        return out


def peak_memory(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Peak bytes of tensor memory allocated while ``fn()`` runs, above what was live before.

    CUDA: ``torch.cuda.max_memory_allocated`` minus the starting allocation. CPU: the peak of
    live tensor storage created during the call (tensors returned by ``fn`` count while alive).
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del result
        return int(peak)
    with _LiveTensorBytes() as tracker:
        result = fn()
    del result
    return int(tracker.peak)
