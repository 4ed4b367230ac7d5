"""RandomErasing, and its draws: torchvision's box search (ten attempts, then nothing) for a whole batch at once.

Each sample's box comes from (seed, epoch, index): area ``uniform(scale) * H * W``, aspect
``exp(uniform(log ratio))`` (height / width), ``h = round(sqrt(area * aspect))``, ``w =
round(sqrt(area / aspect))``, kept when ``h < H`` and ``w < W``, placed uniformly. ``"random"``
values are normal noise from a generator keyed by the same coordinates, mapped to pixel levels
through the cache's mean and standard deviation (what ``normalize=True`` divides by).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import pixelkernels
from .checks import check_fill, check_p, pair_of_numbers
from .draws import keyed_generator, uniforms
from .protocol import Pixel

__all__ = ["RandomErasing", "EraseDraws", "draw_erasing"]

_ATTEMPTS = 10


@dataclass(frozen=True)
class RandomErasing(Pixel):
    """With probability ``p``, a box of ``scale`` x the area and aspect ``ratio`` (height / width) set
    to ``value``: a pixel value, one per channel, or ``"random"`` (per-pixel normal noise). Ten
    attempts at a box that fits, then nothing, as torchvision.

    Values are pixel levels (the rows are uint8 here): 0 is black. ``"random"`` draws each pixel
    ``z ~ N(0, 1)`` in the space ``normalize=True`` gives, i.e. ``255 * (mean + std * z)`` with the
    cache's statistics, as torchvision's erasing after ``Normalize`` (DeiT's place for it) does."""

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | tuple[float, ...] | str = 0

    def __post_init__(self) -> None:
        check_p(self.p, "RandomErasing")
        lo, hi = pair_of_numbers(self.scale, "RandomErasing scale")
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(
                f"RandomErasing: scale must be (min, max) with 0 <= min <= max <= 1, got {self.scale!r}"
            )
        lo, hi = pair_of_numbers(self.ratio, "RandomErasing ratio")
        if not 0.0 < lo <= hi:
            raise ValueError(
                f"RandomErasing: ratio must be (min, max) with 0 < min <= max, got {self.ratio!r}"
            )
        self.values()

    def values(self) -> tuple[int, ...] | None:
        """The erasing value per channel (one for all), or None for ``"random"``."""
        if isinstance(self.value, str):
            if self.value != "random":
                raise ValueError(
                    f"RandomErasing: value must be a number, one per channel, or 'random', got {self.value!r}"
                )
            return None
        return check_fill(self.value, "RandomErasing value", per_channel=True)

    @property
    def needs_stats(self) -> bool:
        """Noise (``value="random"``) is drawn in the space ``normalize=True`` gives: the cache's statistics."""
        return self.values() is None

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        return draw_erasing(self, seed, epoch, idx, stream, out_hw, stats)


@dataclass(frozen=True)
class EraseDraws:
    """``boxes [B, 4]`` (top, left, height, width) and ``erased [B]``; ``values`` per channel, or None for
    noise drawn per sample (``seed``, ``epoch``, ``indices``, ``stream`` key it; ``stats`` = (mean, std)
    per channel in [0, 1])."""

    boxes: np.ndarray
    erased: np.ndarray
    values: tuple[int, ...] | None
    seed: int
    epoch: int
    indices: np.ndarray
    stream: int
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def matrices(self, j: int) -> list:
        return []

    def fill_of(self, j: int, channels: int) -> np.ndarray:
        """Sample ``j``'s erasing values: per channel, or ``[C, h, w]`` noise."""
        if self.values is not None:
            v = np.array([self.values[c % len(self.values)] for c in range(channels)], dtype=np.uint8)
            return v
        _, _, h, w = (int(v) for v in self.boxes[j])
        z = keyed_generator(self.seed, self.epoch, int(self.indices[j]), self.stream).standard_normal(
            (channels, h, w), dtype=np.float32
        )
        mean, std = self.stats if self.stats is not None else ((0.5,), (0.25,))
        m = np.array([mean[c % len(mean)] for c in range(channels)], np.float32)[:, None, None]
        s = np.array([std[c % len(std)] for c in range(channels)], np.float32)[:, None, None]
        return np.clip(np.round(255.0 * (m + s * z)), 0, 255).astype(np.uint8)

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        if self.erased[j]:
            pixelkernels.erase(chw, self.boxes[j], self.fill_of(j, chw.shape[0]))

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        for j in np.flatnonzero(self.erased).tolist():
            top, left, h, w = (int(v) for v in self.boxes[j])
            values = torch.from_numpy(self.fill_of(j, x.shape[1]).astype(np.float32)).to(x.device)
            x[j, :, top : top + h, left : left + w] = values if values.dim() == 3 else values.view(-1, 1, 1)
        return x


def draw_erasing(
    step: RandomErasing,
    seed: int,
    epoch: int,
    idx: np.ndarray,
    stream: int,
    out_hw: tuple[int, int],
    stats=None,
) -> EraseDraws:
    """Every sample's erasing box, as torchvision's ``RandomErasing.get_params`` draws it."""
    n = len(idx)
    height, width = out_hw
    u = uniforms(seed, epoch, idx, stream, 1 + 4 * _ATTEMPTS)
    applied = u[:, 0] < step.p
    u = u[:, 1:].reshape(n, _ATTEMPTS, 4)
    area = height * width * (step.scale[0] + u[:, :, 0] * (step.scale[1] - step.scale[0]))
    log_lo, log_hi = math.log(step.ratio[0]), math.log(step.ratio[1])
    aspect = np.exp(log_lo + u[:, :, 1] * (log_hi - log_lo))
    h = np.round(np.sqrt(area * aspect))
    w = np.round(np.sqrt(area / aspect))
    ok = (h < height) & (w < width)
    first = np.argmax(ok, axis=1)
    rows = np.arange(n)
    h, w = h[rows, first], w[rows, first]
    top = np.floor(u[rows, first, 2] * (height - h + 1))
    left = np.floor(u[rows, first, 3] * (width - w + 1))
    boxes = np.stack([top, left, h, w], axis=1).astype(np.int64)
    return EraseDraws(
        boxes=boxes,
        erased=applied & ok.any(axis=1),
        values=step.values(),
        seed=seed,
        epoch=epoch,
        indices=np.asarray(idx, dtype=np.int64),
        stream=stream + 500,
        stats=stats,
    )
