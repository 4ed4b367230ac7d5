"""Batched on-the-fly augmentation: torchvision-style transforms that ``make_loader(augment=[...])`` runs.

The transforms are descriptions, not functions: ``make_loader`` compiles a list of them into a
``Plan`` (``cachekit.augment.plan``) that draws every sample's parameters for a whole batch at once,
from (seed, epoch, sample index) alone, so a run reproduces exactly whatever the thread or worker
count, and a resumed epoch gets the same crops. The geometry of a list (resizes, crops, flips)
folds into one crop box and one resize per sample; the loader runs it in threads over the batch,
or as batched matrix products on the device (``cachekit.augment.warp``); colour jitter follows
(``cachekit.augment.colour``).

Crop boxes are whole source pixels; resizing is torchvision's: bilinear, antialiased when it
shrinks (``torch.nn.functional.interpolate(antialias=True)`` on the CPU, the same filter as one
batched matrix product on a device); a crop larger than its image is padded with zeros, as
torchvision's, and ``Letterbox`` pads with its ``fill``. Boxes and masks of caches that have them
go through each sample's very map (``Draws.affine``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .checks import check_fill, check_p, check_size, jitter_range, positive_range
from .draws import uniforms
from .matrices import crop_matrices
from .protocol import Colour, Geometric

__all__ = [
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ColorJitter",
    "CenterCrop",
    "Resize",
    "Letterbox",
    "TRANSFORMS",
]


_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its central fallback


def _rrc_boxes(step: RandomResizedCrop, u: np.ndarray, vh: np.ndarray, vw: np.ndarray) -> np.ndarray:
    """torchvision's ``RandomResizedCrop.get_params`` for every sample at once: (top, left, h, w)."""
    area = (vh * vw)[:, None]
    log_lo, log_hi = math.log(step.ratio[0]), math.log(step.ratio[1])
    target = area * (step.scale[0] + u[:, :, 0] * (step.scale[1] - step.scale[0]))
    aspect = np.exp(log_lo + u[:, :, 1] * (log_hi - log_lo))
    w = np.round(np.sqrt(target * aspect))
    h = np.round(np.sqrt(target / aspect))
    ok = (w > 0) & (w <= vw[:, None]) & (h > 0) & (h <= vh[:, None])
    first = np.argmax(ok, axis=1)
    rows = np.arange(len(vh))
    h, w = h[rows, first], w[rows, first]
    top = np.floor(u[rows, first, 2] * (vh - h + 1))
    left = np.floor(u[rows, first, 3] * (vw - w + 1))
    # no attempt fit: the central crop of the closest allowed aspect ratio
    fallback = ~ok.any(axis=1)
    if fallback.any():
        in_ratio = vw / vh
        fw = np.where(
            in_ratio < step.ratio[0], vw, np.where(in_ratio > step.ratio[1], np.round(vh * step.ratio[1]), vw)
        )
        fh = np.where(in_ratio < step.ratio[0], np.round(vw / step.ratio[0]), vh)
        h, w = np.where(fallback, fh, h), np.where(fallback, fw, w)
        top = np.where(fallback, (vh - fh) // 2, top)
        left = np.where(fallback, (vw - fw) // 2, left)
    return np.stack([top, left, h, w], axis=1)


def _letterbox_boxes(size: tuple[int, int], vh: np.ndarray, vw: np.ndarray) -> np.ndarray:
    """The part of the view that a letterbox to ``size`` (height, width) shows: the view scaled by
    the largest factor that fits it in (sides rounded, as YOLO does), centred; (top, left, height,
    width) in view pixels. For a square ``size`` the factor is ``side / max(vh, vw)``, bit for bit."""
    out_h, out_w = size
    scale = np.minimum(out_h / vh, out_w / vw)
    nh, nw = np.maximum(1, np.round(vh * scale)), np.maximum(1, np.round(vw * scale))
    sy, sx = nh / vh, nw / vw
    top, left = np.floor((out_h - nh) / 2), np.floor((out_w - nw) / 2)
    return np.stack([-top / sy, -left / sx, out_h / sy, out_w / sx], axis=1)


class _CropToSize(Geometric):
    """A crop of each view (``crop_boxes``, the subclass's) resized to ``size``: its map, and the
    fixed output size it sets (RandomResizedCrop, CenterCrop, Letterbox)."""

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        """Its crop of each view, resized to its size."""
        top, left, ch, cw = self.crop_boxes(seed, epoch, idx, stream, vh, vw).T
        out_h, out_w = check_size(self.size, type(self).__name__)
        n = len(idx)
        return crop_matrices(top, left, ch, cw, out_h, out_w), np.full(n, float(out_h)), np.full(n, float(out_w))

    def fixed_size(self, size):
        return check_size(self.size, type(self).__name__)

    def size_varies(self, varies: bool) -> bool:
        return False

    def carry_rects(self, walk, own, stream, view_h, view_w) -> None:
        """A crop of the view, resized: its exact rect, as its map was drawn from it."""
        walk.rects.crop(self.crop_boxes(walk.seed, walk.epoch, walk.idx, stream, view_h, view_w), view_h, view_w)


@dataclass(frozen=True)
class RandomResizedCrop(_CropToSize):
    """A random box of ``scale`` x the area and aspect ``ratio``, resized to ``size`` (torchvision's)."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        check_size(self.size, "RandomResizedCrop")
        positive_range(self.scale, "RandomResizedCrop scale")
        positive_range(self.ratio, "RandomResizedCrop ratio")

    def crop_boxes(self, seed, epoch, idx, stream, vh, vw):
        """Each sample's crop ``(top, left, height, width)`` of its ``vh`` x ``vw`` view (torchvision's draw)."""
        n = len(idx)
        u = uniforms(seed, epoch, idx, stream, _ATTEMPTS * 4).reshape(n, _ATTEMPTS, 4)
        return _rrc_boxes(self, u, vh, vw)


@dataclass(frozen=True)
class RandomHorizontalFlip(Geometric):
    """Mirror left-right with probability ``p``."""

    MIRROR = True
    DRAWS = 1

    p: float = 0.5

    def __post_init__(self) -> None:
        check_p(self.p, "RandomHorizontalFlip")

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        flip, f = uniforms(seed, epoch, idx, stream, 1)[:, 0] < self.p, np.tile(np.eye(3), (len(idx), 1, 1))
        f[flip, 0, 0], f[flip, 0, 2] = -1.0, vw[flip]
        return f, vh, vw

    def carry_rects(self, walk, own, stream, view_h, view_w) -> None:
        walk.rects.flips ^= own[:, 0, 0] < 0


@dataclass(frozen=True)
class ColorJitter(Colour):
    """Brightness, contrast and saturation factors in [max(0, 1 - x), 1 + x], hue shift in [-hue,
    hue] turns (hue <= 0.5); each may also be a ``(min, max)`` pair, as torchvision's.

    Applied in a random order drawn per sample, as torchvision's ``ColorJitter`` does.
    """

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0
    hue: float | tuple[float, float] = 0.0

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            jitter_range(getattr(self, name), name, 1.0, 0.0)
        jitter_range(self.hue, "hue", 0.0, -0.5, 0.5)

    def ranges(self) -> list[tuple[float, float]]:
        """(min, max) of the brightness, contrast and saturation factors and of the hue shift."""
        return [
            jitter_range(getattr(self, n), n, 1.0, 0.0) for n in ("brightness", "contrast", "saturation")
        ] + [jitter_range(self.hue, "hue", 0.0, -0.5, 0.5)]

    def draw_colour(self, seed: int, epoch: int, idx: np.ndarray, stream: int) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's factors and hue shift, uniform in its ranges (float32 ``[n, 4]``), and the order
        they apply in (a permutation per sample, int8 ``[n, 4]``), from streams ``stream`` and + 1000."""
        u = uniforms(seed, epoch, idx, stream, 4)
        factors = np.stack([lo + u[:, k] * (hi - lo) for k, (lo, hi) in enumerate(self.ranges())], axis=1)
        order = np.argsort(uniforms(seed, epoch, idx, stream + 1000, 4), axis=1).astype(np.int8)
        return factors.astype(np.float32), order


@dataclass(frozen=True)
class CenterCrop(_CropToSize):
    """The central ``size`` region (padded with zeros where the image is smaller)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        check_size(self.size, "CenterCrop")

    def crop_boxes(self, seed, epoch, idx, stream, vh, vw):
        """Each sample's central crop ``(top, left, height, width)`` of its ``vh`` x ``vw`` view."""
        out_h, out_w = check_size(self.size, "CenterCrop")
        n = len(idx)
        return np.stack(
            [np.round((vh - out_h) / 2), np.round((vw - out_w) / 2), np.full(n, out_h), np.full(n, out_w)],
            axis=1,
        ).astype(np.float64)


@dataclass(frozen=True)
class Resize(Geometric):
    """An int resizes the shorter side to ``size`` keeping the aspect ratio; a pair sets (height, width)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        check_size(self.size, "Resize")

    def view_size(self, vh: np.ndarray, vw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The view's size after it (torchvision's truncation of the longer side)."""
        if isinstance(self.size, int):
            portrait = vw <= vh
            return (np.where(portrait, np.floor(self.size * vh / vw), self.size),
                    np.where(portrait, self.size, np.floor(self.size * vw / vh)))  # fmt: skip
        n = len(vh)
        return np.full(n, float(self.size[0])), np.full(n, float(self.size[1]))

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        nh, nw = self.view_size(vh, vw)
        s = np.tile(np.eye(3), (len(idx), 1, 1))
        s[:, 0, 0], s[:, 1, 1] = nw / vw, nh / vh
        return s, nh, nw

    def carry_rects(self, walk, own, stream, view_h, view_w) -> None:
        walk.rects.resize(walk.vh, walk.vw)

    def fixed_size(self, size):
        return None if isinstance(self.size, int) else check_size(self.size, "Resize")

    def size_varies(self, varies: bool) -> bool:
        return varies if isinstance(self.size, int) else False


@dataclass(frozen=True)
class Letterbox(_CropToSize):
    """YOLO's letterbox: the image scaled, keeping its aspect ratio, to fit ``size`` (an int: a square;
    or ``(height, width)``, as Ultralytics' ``LetterBox(new_shape)``), centred on a canvas of that
    size filled with ``fill`` (114, YOLO's grey). Boxes, masks and keypoints move with the image."""

    size: int | tuple[int, int]
    fill: int = 114

    def __post_init__(self) -> None:
        check_size(self.size, "Letterbox")
        check_fill(self.fill, "Letterbox")

    def crop_boxes(self, seed, epoch, idx, stream, vh, vw):
        """The part of each view that the letterbox shows (``_letterbox_boxes``)."""
        return _letterbox_boxes(check_size(self.size, "Letterbox"), vh, vw)

    def map_fill(self, fill):
        return self.fill


TRANSFORMS = (RandomResizedCrop, RandomHorizontalFlip, ColorJitter, CenterCrop, Resize, Letterbox)
