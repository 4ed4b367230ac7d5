"""What the device does to a batch read as stored: one typed object, made by the plan's draws.

A batch augmented on the device travels from the reading threads (or a worker process) with a
``DeviceWork``: where each output comes from (crop boxes and flips, or one 3x3 map per sample from
its pixel source), ColorJitter's factors, the per-sample pixel stage, the user's batch ops and
MixUp/CutMix. ``apply`` runs them in that order on the batch, wherever it is; ``to`` moves its
tensors to the device (the few read on the host stay there: a device read would sync it), and
``pin_memory`` pins them as a DataLoader pins a batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from .colour import jitter_batch
from .warp import warp_batch
from .warpmatrix import warp_fast_batch, warp_maps_batch

__all__ = ["DeviceWork"]

#: Tensors read on the host when the batch is transformed (reading them from the device would sync it).
_HOST = ("order",)


@dataclass
class DeviceWork:
    """``sizes [n, 2]`` each pixel source's size; ``out_size`` the output's; ``fill`` what a map
    uncovers. Geometry, one of: ``boxes [n, 4]`` (top, left, height, width) + ``flips [n]`` (+ ``pre
    [n, 2]``, a first resize of the whole image), the crop+resize path; ``boxes`` + ``flips`` +
    ``vflips``, whole-pixel crops of general maps; ``matrices [n, 3, 3]`` (+ ``shrink [n, 2]``), one
    warp per sample. Then ``jitter [n, 4]`` in ``order [n, 4]`` (``hue``: whether any shifts hue),
    the pixel ``stage``, the user's ``batch_ops`` and the ``mix``, each None when absent."""

    sizes: torch.Tensor
    out_size: tuple[int, int]
    fill: int = 0
    boxes: torch.Tensor | None = None
    flips: torch.Tensor | None = None
    vflips: torch.Tensor | None = None
    pre: torch.Tensor | None = None
    matrices: torch.Tensor | None = None
    shrink: torch.Tensor | None = None
    jitter: torch.Tensor | None = None
    order: torch.Tensor | None = None
    hue: bool = False
    stage: Any = None
    batch_ops: Any = None
    mix: Any = None

    def _tensors(self, fn) -> DeviceWork:
        changes = {
            f.name: fn(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor) and f.name not in _HOST
        }
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device) -> DeviceWork:
        """Its tensors on ``device`` (copies queued on the current stream)."""
        return self._tensors(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> DeviceWork:
        return self._tensors(lambda t: t.pin_memory())

    def apply(self, images: torch.Tensor) -> torch.Tensor:
        """The batch's augmentation, in order: a float batch in [0, 255] of ``out_size``."""
        fill = float(self.fill)
        if self.matrices is not None:  # one 3x3 map per sample
            x = warp_maps_batch(images, self.matrices, self.sizes, self.out_size, fill, self.shrink)
        elif self.vflips is not None:  # whole-pixel crops with vertical flips
            x = warp_fast_batch(images, self.boxes, self.flips, self.vflips, self.sizes, self.out_size, fill)
        else:
            x = warp_batch(images, self.boxes, self.flips, self.sizes, self.out_size, fill, self.pre)
        if self.jitter is not None:
            x = jitter_batch(x, self.jitter, hue=self.hue, order=self.order)
        if self.stage is not None:  # per-sample pixel transforms (RandAugment, erasing, ...)
            x = self.stage.apply_batch(x)
        if self.batch_ops is not None:  # the user's BatchOps, on either side of MixUp / CutMix as listed
            x = self.batch_ops.apply_batch(x, after=False)
        if self.mix is not None:
            x = self.mix.apply_batch(x)
        if self.batch_ops is not None:
            x = self.batch_ops.apply_batch(x, after=True)
        return x
