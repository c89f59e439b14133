"""Measuring the peak memory of a training pass.

On CUDA the caching allocator keeps exact statistics: :func:`measure_peak` resets
the peak counter and reads ``torch.cuda.max_memory_allocated`` after the pass,
minus what was allocated before it.

On CPU there is no allocator statistic, so :class:`LiveTensorBytes` accounts for
every tensor storage created while it is active (a ``TorchDispatchMode`` sees the
output of every ATen operation, forward, backward and recomputation alike, and a
weak reference to each storage tells it when the storage is freed). Its peak is the
largest number of bytes alive at once: saved activations plus the largest
transient. Storages that existed before (parameters, gradients of earlier passes)
are not seen; the caller adds them from their sizes (:func:`model_state_bytes`).
Views share their base's storage and are counted once; tensor wrapper subclasses
through their inner tensors.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Tracks bytes of CPU tensor storages created inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: dict[int, Any] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            # A wrapper subclass (the functional collectives' AsyncCollectiveTensor,
            # DTensor) has no storage of its own: its inner tensors are counted.
            if (
                isinstance(value, torch.Tensor)
                and value.device.type == "cpu"
                and not is_traceable_wrapper_subclass(value)
            ):
                self._track(value)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        size = storage.nbytes()
        if size == 0 or key in self._alive:
            return
        self.live += size
        self.peak = max(self.peak, self.live)
        self._alive[key] = weakref.ref(storage, self._on_free(key, size))

    def _on_free(self, key: int, size: int) -> Callable[[Any], None]:
        def release(_: Any) -> None:
            if self._alive.pop(key, None) is not None:
                self.live -= size

        return release


def model_state_bytes(model: nn.Module, optimizer_states_per_param: int = 2) -> int:
    """Bytes of parameters and, for those that train, their gradients and
    ``optimizer_states_per_param`` optimizer tensors of the parameter's size each
    (Adam/AdamW: 2, the moments); a frozen parameter (LoRA's base) holds neither."""
    total = 0
    for p in model.parameters():
        states = 2 + optimizer_states_per_param if p.requires_grad else 1
        total += p.numel() * p.element_size() * states
    return total


def measure_peak(device: torch.device, run: Callable[[], Any]) -> tuple[int, Any]:
    """Peak bytes allocated while ``run()`` executes beyond what was allocated before it
    (parameters, existing gradients), and ``run``'s result."""
    if device.type == "cuda":  # pragma: no cover - needs a GPU
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = run()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device)) - before, result
    # Tensors held only by reference cycles are freed when the cyclic garbage collector
    # runs, which depends on the process's history (a long test process, a forked
    # worker): hold the collector off during the pass, so that the same pass measures
    # the same peak wherever it runs. (No collection before it: only storages created
    # inside are counted, and a full collection costs about 0.13 s in a worker.)
    enabled = gc.isenabled()
    gc.disable()
    tracker = LiveTensorBytes()
    try:
        with tracker:
            result = run()
    finally:
        if enabled:
            gc.enable()
    return tracker.peak, result
