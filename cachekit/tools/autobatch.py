"""``autobatch``: the largest batch whose training step fits in a share of the memory that is free.

It profiles the step (forward, backward and one optimizer step, so the optimizer's state counts)
at a few small batch sizes, fits peak memory against batch size (a straight line: fixed cost +
per-sample cost), predicts the largest batch under the budget, then confirms it by running it,
backing off by binary search on an out-of-memory error. The model's weights and buffers are
restored afterwards.

On CUDA the budget is what this process holds now plus ``fraction`` of what the driver reports
free (``torch.cuda.mem_get_info``: other processes' memory excluded), and the peak is the
allocator's ``max_memory_reserved``. With ``device="cpu"`` and ``memory_budget=`` the peak is
the storages the step keeps alive (parameters, gradients, optimizer state, the input and the
tensors saved for backward), each counted once however many tensors view it, so the same search is
testable and usable without a GPU.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Sequence

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


class _CudaMeter:
    """Peak reserved memory of one step on a CUDA device, against a share of its free memory."""

    def __init__(self, device: torch.device, fraction: float, memory_budget: int | None) -> None:
        self.device = device
        torch.cuda.empty_cache()
        if memory_budget is not None:
            self.budget = int(fraction * memory_budget)
        else:
            # What this process's allocator holds (the model, already there) plus a share of what
            # nobody holds. YOLOv5 takes total - reserved - allocated, which misses other
            # processes on the same GPU; the driver's free figure does not.
            free, _total = torch.cuda.mem_get_info(device)
            self.budget = int(torch.cuda.memory_reserved(device) + fraction * free)

    @contextlib.contextmanager
    def track(self):
        torch.cuda.reset_peak_memory_stats(self.device)
        yield

    def peak(self, model: nn.Module, batch: torch.Tensor, optimizer) -> int:
        return int(torch.cuda.max_memory_reserved(self.device))

    def release(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()


def _storages(tensors: Iterable[torch.Tensor | None]) -> dict[int, int]:
    """Storage data pointer -> bytes, for the storages behind ``tensors`` (views share one)."""
    found = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            storage = t.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
    return found


class _HostMeter:
    """The storages a step keeps alive, each counted once, against an explicit memory budget."""

    def __init__(self, device: torch.device, fraction: float, memory_budget: int | None) -> None:
        if memory_budget is None:
            raise UsageError(f"autobatch(device={device.type!r}) needs memory_budget=<bytes>")
        self.budget = int(fraction * memory_budget)
        self._saved: list[torch.Tensor] = []

    @contextlib.contextmanager
    def track(self):
        self._saved = []

        def pack(t: torch.Tensor):
            self._saved.append(t)
            return t

        # holding them until peak() also keeps their memory from being reused, so no two live
        # storages share a data pointer
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def peak(self, model: nn.Module, batch: torch.Tensor, optimizer) -> int:
        params = list(model.parameters())
        state = [v for s in (optimizer.state.values() if optimizer else ()) for v in s.values()]
        live = _storages([*params, *(p.grad for p in params), *state, batch, *self._saved])
        self._saved = []
        return sum(live.values())

    def release(self) -> None:
        self._saved = []  # what is counted is what is referenced: no collection needed


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
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None,
) -> int:
    """The largest batch size (<= ``max_batch``) whose training step fits in ``fraction`` of free memory.

    A step is forward, backward and one step of ``optimizer`` (a function of the parameters,
    default ``torch.optim.AdamW``: pass the one you train with, its state is part of the step's
    memory). On CUDA the budget is the memory this process holds now plus ``fraction`` of the
    device's free memory; ``memory_budget`` (bytes) replaces that with ``fraction`` of a fixed
    amount, and on the CPU it is required. ``amp=True`` measures the step under
    ``torch.autocast``. The model's weights and buffers are as they were when it returns. Raises
    UsageError when even a batch of one does not fit.
    """
    if not 0 < fraction <= 1:
        raise UsageError(f"fraction must be in (0, 1], got {fraction}")
    if max_batch < 1:
        raise UsageError("max_batch must be at least 1")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            "autobatch(device='cuda') needs a CUDA GPU and none is available; "
            "pass device='cpu' with memory_budget=<bytes> to plan against a budget instead"
        )
    model = model.to(device)  # before the budget: the weights are part of what is held already
    meter = (_CudaMeter if device.type == "cuda" else _HostMeter)(device, fraction, memory_budget)
    return _plan(model, sample_shape, device, meter, max_batch, amp, loss_fn, input_dtype, optimizer)


def _plan(model, sample_shape, device, meter, max_batch, amp, loss_fn, input_dtype, optimizer) -> int:
    """The search itself, on tensors on ``device`` measured by ``meter``."""
    loss_fn = loss_fn or _default_loss
    make_optimizer = optimizer or torch.optim.AdamW
    trainable = [p for p in model.parameters() if p.requires_grad]
    saved = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    was_training = model.training
    model.train()
    autocast_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16

    def step(batch_size: int) -> int:
        """One training step at ``batch_size``; its peak bytes, or raise _OverBudget / OOM."""
        batch = torch.zeros((batch_size, *sample_shape), dtype=input_dtype, device=device)
        opt = make_optimizer(trainable) if trainable else None
        try:
            with meter.track():
                autocast = (
                    torch.autocast(device.type, dtype=autocast_dtype) if amp else contextlib.nullcontext()
                )
                with autocast:
                    loss = loss_fn(model(batch))
                loss.backward()
                if opt is not None:
                    opt.step()
                peak = meter.peak(model, batch, opt)
        finally:
            model.zero_grad(set_to_none=True)
            del batch, opt
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

    try:
        return _search(fits, max_batch, meter.budget)
    finally:
        with torch.no_grad():
            model.load_state_dict(saved)
        model.train(was_training)


def _search(fits: Callable[[int], int | None], max_batch: int, budget: int) -> int:
    sizes, peaks, bad = [], [], None
    for b in (s for s in _PROFILE_SIZES if s <= max_batch):
        peak = fits(b)
        if peak is None:
            bad = b
            break
        sizes.append(b)
        peaks.append(peak)
    if not sizes:
        raise UsageError(f"a batch of 1 does not fit in {budget / 1e6:.1f} MB")
    good = sizes[-1]
    if bad is None and good < max_batch:
        # memory = fixed + per_sample * batch: predict the largest batch under the budget
        per_sample, fixed = np.polyfit(sizes, peaks, 1) if len(sizes) > 1 else (peaks[0], 0.0)
        guess = max_batch if per_sample <= 0 else int((budget - fixed) // per_sample)
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
