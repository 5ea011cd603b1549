"""Counting what a step asks of the GPU: kernel launches and host syncs.

On a GPU a step is fast only when the host keeps the device busy: few launches (a CUDA graph is
one) and no waits on the device before the step's one copy of its tokens. These counts are
measured, not declared:

- launches: CUDA runtime and driver launch calls (kernels, Triton's included, and graph launches)
  recorded by the PyTorch profiler;
- host syncs: PyTorch's sync debug mode warns on every operation that waits for the device
  (``.item()``, ``.tolist()``, a copy to pageable host memory, ...); each warning is one sync.

Counting costs far more than the step, so the engine counts only when asked
(``EngineConfig.count_device_calls``, for a runner that is not synchronous); the counts go to
``StepStats``. On a CPU there is nothing to count and both stay None.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")

LAUNCH_CALLS = ("LaunchKernel", "GraphLaunch")   # cudaLaunchKernel(ExC), cuLaunchKernel(Ex) (Triton), cudaGraphLaunch


@dataclass(frozen=True)
class DeviceCalls:
    launches: int | None   # None: the profiler saw no CUDA calls at all
    host_syncs: int


def count_device_calls(fn: Callable[[], T], device: torch.device | None = None) -> tuple[T, DeviceCalls | None]:
    """Run ``fn`` and count its launches and host syncs on ``device`` (default: the current CUDA
    device; on a CPU device the counts are None)."""
    if device is not None and device.type != "cuda":
        return fn(), None
    from torch.profiler import ProfilerActivity, profile

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught, \
            profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
        torch.cuda.synchronize(device)
    syncs = sum(1 for w in caught if "synchroniz" in str(w.message))
    launches = sum(1 for event in prof.events() if any(call in event.name for call in LAUNCH_CALLS))
    # Launch calls come from CUPTI; where it sees nothing (a sandboxed runtime) they are unknown, not zero.
    return result, DeviceCalls(launches=launches or None, host_syncs=syncs)
