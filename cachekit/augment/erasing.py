"""RandomErasing's draws: torchvision's box search (ten attempts, then nothing) for a whole batch at once.

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
from .draws import uniforms
from .photometric import RandomErasing

__all__ = ["EraseDraws", "draw_erasing", "keyed_generator"]

_ATTEMPTS = 10


def keyed_generator(seed: int, epoch: int, index: int, stream: int) -> np.random.Generator:
    """A generator that depends on (seed, epoch, index, stream) alone (Philox keyed by their hash)."""
    bits = (uniforms(seed, epoch, np.array([index]), stream, 2)[0] * 2.0**53).astype(np.uint64)
    return np.random.Generator(np.random.Philox(key=bits))


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
