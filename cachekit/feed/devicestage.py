"""The loader's last stage: batches to the device, finished there (augmentation, dtype, normalisation, layout).

Loader work (``feed/``): the device's part of a batch's augmentation is what the batch carries
(``augment.devicework.DeviceWork``); this stage moves it and runs it.

On CUDA the copy of batch t+1 and its transforms run on a side stream while the model works on
batch t; the training stream waits for that stream's event before it touches the batch, and the
batch's memory is recorded on the training stream so the allocator does not hand it out early.
Everywhere else (``device="cpu"``, or no device) the very same code runs without streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..augment.devicework import DeviceWork
from ..image.ops import planes_into_hwc
from .buffers import BufferPool
from .stages import clock, timed

__all__ = ["DeviceStage", "check_device", "channels_last"]


def check_device(device: torch.device | str | None) -> torch.device | None:
    """``device`` as a torch device, refused in one line when it cannot be used here."""
    if device is None:
        return None
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a device ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but CUDA is not available here: pass device='cpu' or None")
    return device


def _tensors_in(value) -> Iterator[torch.Tensor]:
    """Every tensor in a batch: its images, labels, and the tensors of per-sample target dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)


#: The dtypes OpenCV merges (torch's own copy takes the rest).
_MERGED = (torch.uint8, torch.float32)


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """A ``[B, C, H, W]`` batch in channels-last memory, the same values. A CPU batch of planes is
    interleaved a sample at a time by OpenCV (``image.ops.planes_into_hwc``): torch's copy of a uint8
    batch runs element by element on the CPU (88 ms for 32 samples of 640 x 640, 3 ms by OpenCV)."""
    if x.is_contiguous(memory_format=torch.channels_last):
        return x
    if x.device.type != "cpu" or x.dtype not in _MERGED or x.shape[1] < 2 or not x.is_contiguous():
        return x.contiguous(memory_format=torch.channels_last)
    b, c, h, w = x.shape
    dst = _blocks.get((b, h, w, c), _numpy_dtype(x.dtype))
    src = x.numpy()
    for i in range(b):
        planes_into_hwc(src[i], dst[i])
    return torch.from_numpy(dst).permute(0, 3, 1, 2)


_blocks = BufferPool(keep=4)  # interleaved batches: a fresh 40 MB one costs its page faults again


def _numpy_dtype(dtype: torch.dtype) -> type:
    return np.uint8 if dtype == torch.uint8 else np.float32


class DeviceStage:
    """Finishes host batches ``(images, labels[, aux | sizes])`` into what the training step gets."""

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        dtype: torch.dtype | None = None,
        mean: Any = None,
        std: Any = None,
        channels_last: bool = False,
        stages: str | None = None,
    ) -> None:
        self.device = check_device(device)
        self.stages = stages  # a profiled loader's StageLog folder: each batch's work timed as "copy"
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise ValueError(
                f"dtype must be a torch floating point type such as torch.bfloat16 (images come in "
                f"[0, 1]), got {dtype!r}"
            )
        self.dtype = dtype
        self.mean = None if mean is None else torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = None if std is None else torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        if self.std is not None and not bool((self.std > 0).all()):
            raise ValueError(
                f"normalize: a channel of this cache has standard deviation 0 (std {std}): "
                "normalising would divide by zero"
            )
        self.channels_last = channels_last
        cuda = self.device is not None and self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if cuda else None

    # -- per batch ----------------------------------------------------------------------------

    def _move(self, value):
        """``value`` (a tensor, a batch's ``DeviceWork``, or lists and dicts of tensors) on the device."""
        if self.device is None:
            return value
        if isinstance(value, (torch.Tensor, DeviceWork)):
            return value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value.to(self.device)
        if isinstance(value, dict):
            return {k: self._move(v) for k, v in value.items()}
        if isinstance(value, list):  # per-sample target dicts
            return [self._move(v) for v in value]
        return value

    def _images(self, images: torch.Tensor, work: DeviceWork | None) -> tuple[torch.Tensor, bool]:
        """Apply the augmentation left to do; returns (images, scaled_0_255_float)."""
        if work is None:
            return images, False
        return work.apply(images), True

    def _convert(self, x: torch.Tensor, scaled_255: bool) -> torch.Tensor:
        """uint8 (or float in [0, 255] from augmentation) to [0, 1]; floats from elsewhere as they are."""
        wanted = self.dtype or (torch.float32 if self.mean is not None else None)
        if wanted is None:
            return x.round_().clamp_(0, 255).to(torch.uint8) if scaled_255 else x
        owned = True  # a tensor made here (or the augmentation's own) is normalised in place
        if x.dtype == torch.uint8 or scaled_255:
            x = x.to(torch.float32).div_(255.0)
        elif self.mean is not None and x.dtype != torch.float32:
            x = x.to(torch.float32)  # normalisation is computed in fp32 whatever the output type
        else:
            owned = False
        if self.mean is not None and owned:  # the same operations, no batch-sized temporaries
            x = x.sub_(self.mean.to(x.device)).div_(self.std.to(x.device))
        elif self.mean is not None:
            x = (x - self.mean.to(x.device)) / self.std.to(x.device)
        return x.to(wanted)

    def process(self, batch) -> tuple:
        """One batch, start to finish, on the current stream (timed as the ``copy`` stage where the
        loader is profiled: on CUDA, the time to queue it on the side stream)."""
        with timed(clock(self.stages), "copy"):
            return self._process(batch)

    def _process(self, batch) -> tuple:
        images, labels, *rest = batch
        work = rest[0] if rest and isinstance(rest[0], DeviceWork) else None
        images, labels = self._move(images), self._move(labels)
        work = self._move(work)
        extra = [] if work is not None or not rest else [self._move(rest[0])]
        x, scaled = self._images(images, work)
        # normalised as planes, then interleaved: torch's broadcast over channels-last memory costs more
        # than interleaving four bytes a value (224 x 224: 695 against 592 us a sample, one thread)
        x = self._convert(x, scaled)
        if self.channels_last and x.dim() == 4:
            x = channels_last(x)
        return (x, labels, *extra)

    # -- the pipeline -------------------------------------------------------------------------

    def _stage(self, batch) -> tuple[tuple, Any]:
        context = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with context:
            out = self.process(batch)
        event = self.stream.record_event() if self.stream is not None else None
        return out, event

    def _deliver(self, staged: tuple[tuple, Any]) -> tuple:
        out, event = staged
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in _tensors_in(out):
                if t.is_cuda:
                    t.record_stream(current)
        return out

    def run(self, batches: Iterator) -> Iterator[tuple]:
        """Yield finished batches; with a device the next batch is copied and transformed one step
        ahead (on CUDA, on the side stream while the model runs; elsewhere the same code, in turn)."""
        if self.device is None:
            for batch in batches:
                yield self.process(batch)
            return
        pending = None
        for batch in batches:
            staged = self._stage(batch)
            if pending is not None:
                yield self._deliver(pending)
            pending = staged
        if pending is not None:
            yield self._deliver(pending)
