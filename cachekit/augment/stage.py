"""The per-sample stage after the geometry: each output row through the list's pixel transforms, in order.

``Stage`` is the compiled part of an augment list made of ``cachekit.augment.photometric``
transforms, each with its own stream of draws. ``Stage.draw`` gives a batch's ``StageDraws``:
``apply_row`` runs a sample's chain on its uint8 row in place (the loader's threads, right after
the warp and ColorJitter; its first steps run on the sample's channels-last pixels before they are
split into the row, where they can: ``apply_pixels``), ``apply_batch`` runs every chain on a float
batch in torch (the device path); the ops that move pixels (RandAugment's shears, translations, rotations) move the sample's
mask (``move_mask``, nearest, 0 where uncovered) and objects (``carry``: the carrier's movers,
boxes clipped, ``min_visibility``) through the very same maps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..image.instances import Instances, move_mask
from .protocol import PIXEL

__all__ = ["Stage", "StageDraws", "compile_stage"]

#: Streams of the per-sample stage start here (the geometry's are the list positions and + 1000).
STREAM_BASE = 2000


@dataclass(frozen=True)
class StageDraws:
    """A batch's per-sample stage: one draws object per transform, run in list order."""

    parts: tuple
    out_hw: tuple[int, int]

    def apply_pixels(self, hwc: np.ndarray, j: int) -> int:
        """The first steps of sample ``j``'s chain that have a kernel for channels-last pixels
        (``apply_pixels``: RandomHSV's colour conversions work on pixels), on its uint8 ``[H, W, C]``
        pixels before they are split into its row, in place; returns how many ran (``apply_row``
        runs the rest on the row, from there)."""
        done = 0
        for part in self.parts:
            kernel = getattr(part, "apply_pixels", None)
            if kernel is None:
                break
            kernel(hwc, j)
            done += 1
        return done

    def apply_row(self, chw: np.ndarray, j: int, start: int = 0) -> None:
        """Sample ``j``'s chain on its uint8 ``[C, H, W]`` row, in place, from its step ``start`` (those
        before it ran on the pixels: ``apply_pixels``)."""
        for part in self.parts[start:]:
            part.apply_row(chw, j)

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        """Every chain on a float ``[B, C, H, W]`` batch in [0, 255] (rounded to whole values first,
        as the uint8 rows of the CPU path hold them)."""
        x = x.round().clamp_(0, 255)
        if not len(x):
            return x
        for part in self.parts:
            x = part.apply_batch(x)
        return x

    def matrices(self, j: int) -> list[np.ndarray]:
        """Sample ``j``'s maps that move pixels, in order, as its targets take them (3x3, continuous)."""
        return [m for part in self.parts for m in part.matrices(j)]

    def move_mask(self, mask: np.ndarray, j: int) -> None:
        """Sample ``j``'s class map (a row of the batch's mask buffer) through its maps in order,
        nearest, 0 where uncovered; in place."""
        for m in self.matrices(j):
            mask[...] = move_mask(mask, m, self.out_hw)

    def carry(self, objects: Instances, n: int, min_visibility: float) -> Instances:
        """Each of ``n`` samples' objects (sorted by sample) through its maps in order, clipped, those
        keeping less than ``min_visibility`` of their area dropped with their labels and points."""
        parts = []
        for j, (a, b) in enumerate(objects.spans(n)):
            part = objects.select(slice(a, b))
            maps = self.matrices(j)
            parts.append(part.through_each(maps, self.out_hw, min_visibility) if maps else part)
        return Instances.concat(parts, objects)


@dataclass(frozen=True)
class Stage:
    """The per-sample pixel transforms of an augment list, each with its stream."""

    steps: tuple

    @property
    def host_only(self) -> tuple:
        """The steps that run on CPU threads only (the user's ``PixelOp``: numpy on each sample)."""
        return tuple(s for _, s in self.steps if s.HOST_ONLY)

    @property
    def needs_stats(self) -> bool:
        """Whether a transform needs the cache's mean and std (``RandomErasing(value="random")``)."""
        return any(s.needs_stats for _, s in self.steps)

    def draw(self, seed: int, epoch: int, indices, out_hw: tuple[int, int], stats=None) -> StageDraws:
        """A batch's draws for outputs of ``out_hw``; ``stats``: the cache's (mean, std) in [0, 1]."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        parts = [step.draw_stage(seed, epoch, idx, stream, out_hw, stats) for stream, step in self.steps]
        return StageDraws(tuple(parts), tuple(int(v) for v in out_hw))


def compile_stage(steps) -> Stage | None:
    """The per-sample pixel transforms of ``steps`` (any others are left to the caller), streams by
    their place in the list; None when there are none."""
    found = tuple(
        (STREAM_BASE + k, step) for k, step in enumerate(steps) if step.KIND == PIXEL
    )
    return Stage(found) if found else None
