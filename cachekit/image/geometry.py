"""Geometry that moves boxes and masks with their pixels: one map per crop, flip, resize or letterbox.

Coordinates are continuous, with pixel ``i`` covering ``[i, i + 1)`` (COCO's convention, and what a
centre-aligned resize such as OpenCV's or torchvision's preserves): a crop of a box ``(top, left,
height, width)`` resized to ``out_h x out_w`` maps ``x`` to ``(x - left) * out_w / width``. A flip
maps ``x`` to ``out_w - x``. Every recipe step, offline variant and read-time transform is
described as such a map (a separable ``Affine``, or its 3x3 form), applied to the image and, by the
one target carrier (``image.instances``), to its boxes, keypoints and mask alike, so they cannot
drift apart.

Boxes are clipped to the output; a box that keeps less than ``min_visibility`` of its area (after
the map, before clipping) is dropped, as Albumentations' ``min_visibility`` does. Masks are class
maps: each output pixel takes the class of the source pixel under its centre (nearest, never a
blend), and pixels from outside the image take ``fill``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Affine", "DEFAULT_MIN_VISIBILITY", "points_outside", "swap_points", "nearest_rows"]

#: Boxes keeping less than this share of their area after a crop are dropped (Albumentations' term).
DEFAULT_MIN_VISIBILITY = 0.1


@dataclass(frozen=True)
class Affine:
    """``x_out = sx * x + tx``, ``y_out = sy * y + ty`` (a flip has ``sx < 0``)."""

    sx: float = 1.0
    sy: float = 1.0
    tx: float = 0.0
    ty: float = 0.0

    def then(self, other: Affine) -> Affine:
        """This map followed by ``other``."""
        return Affine(
            self.sx * other.sx,
            self.sy * other.sy,
            self.tx * other.sx + other.tx,
            self.ty * other.sy + other.ty,
        )

    @classmethod
    def crop(cls, top: float, left: float, height: float, width: float, out_hw: tuple[int, int]) -> Affine:
        """The box ``(top, left, height, width)`` of the source onto the whole ``out_hw`` output."""
        sy, sx = out_hw[0] / height, out_hw[1] / width
        return cls(sx, sy, -left * sx, -top * sy)

    @classmethod
    def hflip(cls, width: float) -> Affine:
        return cls(-1.0, 1.0, float(width), 0.0)

    def as_matrix(self) -> np.ndarray:
        """The same map as a 3x3 matrix (the one convention of ``image.instances``)."""
        m = np.eye(3)
        m[0, 0], m[1, 1], m[0, 2], m[1, 2] = self.sx, self.sy, self.tx, self.ty
        return m


def points_outside(points: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """``[N, K, 3]`` points (x, y, visibility) with those outside the ``out_hw`` image made visibility 0
    and clipped to it (as Ultralytics clips keypoints); float32, a new array."""
    p = np.array(points, dtype=np.float64).reshape(-1, *np.shape(points)[1:])
    h, w = out_hw
    x, y = p[..., 0], p[..., 1]
    gone = ~np.isfinite(x) | ~np.isfinite(y) | (x < 0) | (x > w) | (y < 0) | (y > h)
    p[..., 2][gone] = 0.0
    p[..., 0] = np.clip(np.nan_to_num(x), 0, w)
    p[..., 1] = np.clip(np.nan_to_num(y), 0, h)
    return p.astype(np.float32)


def swap_points(points: np.ndarray, mirrored, flip_idx) -> np.ndarray:
    """Each object's points reordered by ``flip_idx`` (left and right swapped) where ``mirrored``
    (a bool, or one per object): a mirrored person's left hand is the right one of the image."""
    if flip_idx is None:
        return points
    mirrored = np.broadcast_to(np.asarray(mirrored, dtype=bool), (len(points),))
    if not mirrored.any():
        return points
    out = np.array(points)
    out[mirrored] = out[mirrored][:, np.asarray(flip_idx, dtype=np.int64)]
    return out


def nearest_rows(scale: float, shift: float, out: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``out`` output rows of the map ``y_out = scale * y + shift``: the source row under
    its centre, and whether that row lies inside a source of ``size`` rows."""
    centres = (np.arange(out, dtype=np.float64) + 0.5 - shift) / scale
    rows = np.floor(centres).astype(np.int64)
    inside = (rows >= 0) & (rows < size)
    return np.clip(rows, 0, max(size - 1, 0)), inside
