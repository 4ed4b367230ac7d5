"""``autobatch``: the largest batch whose forward + backward step fits in a share of device memory.

It profiles the step at a few small batch sizes, fits peak memory against batch size (a straight
line: fixed cost + per-sample cost), predicts the largest batch under the budget, then confirms it
by running it, backing off by binary search on an out-of-memory error. On CUDA the peak is the
allocator's ``max_memory_allocated``; with ``device="cpu"`` and ``memory_budget=`` the peak is the
tensors the step keeps alive (input, activations saved for backward, parameters and gradients),
so the same search is testable and usable without a GPU.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import UsageError

__all__ = ["autobatch", "is_out_of_memory"]

_PROFILE_SIZES = (1, 2, 4, 8, 16)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA's OutOfMemoryError and for allocators that say they ran out of memory."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


class _OverBudget(Exception):
    """The step ran, but needed more than the budget: treated like an out-of-memory error."""


def _tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Meter:
    """Peak memory of one step on a device, and the budget it must fit in."""

    def __init__(self, device: torch.device, fraction: float, memory_budget: int | None) -> None:
        self.device = device
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise UsageError(
                    "autobatch(device='cuda') needs a CUDA GPU and none is available; "
                    "pass device='cpu' with memory_budget=<bytes> to plan against a budget instead"
                )
            total = torch.cuda.get_device_properties(device).total_memory
            self.budget = int(fraction * (memory_budget or total))
        elif memory_budget is None:
            raise UsageError(f"autobatch(device={device.type!r}) needs memory_budget=<bytes>")
        else:
            self.budget = int(fraction * memory_budget)
        self._saved = 0

    @contextlib.contextmanager
    def track(self):
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            return
        self._saved = 0

        def pack(t: torch.Tensor):
            self._saved += _tensor_bytes(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def peak(self, model: nn.Module, batch: torch.Tensor) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        params = sum(_tensor_bytes(p) for p in model.parameters())
        return params * 2 + _tensor_bytes(batch) + self._saved  # weights + their gradients

    def release(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _default_loss(output) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output.float().mean()
    if isinstance(output, (list, tuple)):
        return sum(_default_loss(o) for o in output)
    if isinstance(output, dict):
        return sum(_default_loss(o) for o in output.values())
    raise TypeError(f"cannot make a loss from a {type(output).__name__}; pass loss_fn=")


def autobatch(
    model: nn.Module,
    sample_shape: Sequence[int],
    device: str | torch.device = "cuda",
    fraction: float = 0.8,
    max_batch: int = 4096,
    amp: bool = False,
    *,
    memory_budget: int | None = None,
    loss_fn: Callable[[object], torch.Tensor] | None = None,
    input_dtype: torch.dtype = torch.float32,
) -> int:
    """The largest batch size (<= ``max_batch``) whose training step fits in ``fraction`` of memory.

    ``memory_budget`` (bytes) replaces the device's total memory; on the CPU it is required.
    ``amp=True`` measures the step under ``torch.autocast``. Raises UsageError when even a batch
    of one does not fit.
    """
    if not 0 < fraction <= 1:
        raise UsageError(f"fraction must be in (0, 1], got {fraction}")
    if max_batch < 1:
        raise UsageError("max_batch must be at least 1")
    device = torch.device(device)
    meter = _Meter(device, fraction, memory_budget)
    loss_fn = loss_fn or _default_loss
    model = model.to(device).train()
    autocast_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16

    def step(batch_size: int) -> int:
        """Run forward + backward at ``batch_size``; its peak bytes, or raise _OverBudget / OOM."""
        batch = torch.zeros((batch_size, *sample_shape), dtype=input_dtype, device=device)
        try:
            with meter.track():
                autocast = (
                    torch.autocast(device.type, dtype=autocast_dtype) if amp else contextlib.nullcontext()
                )
                with autocast:
                    loss = loss_fn(model(batch))
                loss.backward()
            peak = meter.peak(model, batch)
        finally:
            model.zero_grad(set_to_none=True)
            del batch
            meter.release()
        if peak > meter.budget:
            raise _OverBudget(peak)
        return peak

    def fits(batch_size: int) -> int | None:
        try:
            return step(batch_size)
        except _OverBudget:
            return None
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            meter.release()
            return None

    sizes, peaks, bad = [], [], None
    for b in (s for s in _PROFILE_SIZES if s <= max_batch):
        peak = fits(b)
        if peak is None:
            bad = b
            break
        sizes.append(b)
        peaks.append(peak)
    if not sizes:
        raise UsageError(f"a batch of 1 does not fit in {meter.budget / 1e6:.1f} MB")
    good = sizes[-1]
    if bad is None and good < max_batch:
        # memory = fixed + per_sample * batch: predict the largest batch under the budget
        per_sample, fixed = np.polyfit(sizes, peaks, 1) if len(sizes) > 1 else (peaks[0], 0.0)
        guess = max_batch if per_sample <= 0 else int((meter.budget - fixed) // per_sample)
        guess = max(good + 1, min(max_batch, guess))
        if fits(guess) is None:
            bad = guess
        else:
            good, grow = guess, 1
            while good < max_batch:  # confirm guess + 1 fails; if not, grow until something does
                probe = min(max_batch, good + grow)
                if fits(probe) is None:
                    bad = probe
                    break
                good, grow = probe, grow * 2
    while bad is not None and bad - good > 1:  # binary search between a fit and a failure
        mid = (good + bad) // 2
        if fits(mid) is None:
            bad = mid
        else:
            good = mid
    return good
