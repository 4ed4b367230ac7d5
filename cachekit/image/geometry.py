"""Geometry that moves boxes and masks with their pixels: one map per crop, flip, resize or letterbox.

Coordinates are continuous, with pixel ``i`` covering ``[i, i + 1)`` (COCO's convention, and what a
centre-aligned resize such as OpenCV's or torchvision's preserves): a crop of a box ``(top, left,
height, width)`` resized to ``out_h x out_w`` maps ``x`` to ``(x - left) * out_w / width``. A flip
maps ``x`` to ``out_w - x``. Every recipe step, offline variant and read-time transform is
described as such a map, applied to the image, its boxes (``move_boxes``) and its mask
(``warp_mask``) alike, so they cannot drift apart.

Boxes are clipped to the output; a box that keeps less than ``min_visibility`` of its area (after
the map, before clipping) is dropped, as Albumentations' ``min_visibility`` does. Masks are class
maps: each output pixel takes the class of the source pixel under its centre (nearest, never a
blend), and pixels from outside the image take ``fill``.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

__all__ = [
    "Affine",
    "DEFAULT_MIN_VISIBILITY",
    "move_boxes",
    "move_boxes_matrix",
    "move_points",
    "move_points_matrix",
    "points_outside",
    "swap_points",
    "warp_mask",
    "warp_mask_matrix",
    "warp_mask_map",
    "nearest_rows",
]

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


def _clip(boxes: np.ndarray, before: np.ndarray, out_hw: tuple[int, int], min_visibility: float) -> tuple:
    """Clip ``[N, 4]`` xyxy boxes to the output; which boxes keep enough of their ``before`` area."""
    h, w = out_hw
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, w)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, h)
    after = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = (after > 0) & (after >= min_visibility * before)
    return boxes, keep


def _select(target: dict, boxes: np.ndarray, keep: np.ndarray) -> dict:
    out = {k: np.asarray(v)[keep] for k, v in target.items() if k != "boxes"}
    out["boxes"] = np.ascontiguousarray(boxes[keep], dtype=np.float32)
    return out


def move_boxes(
    target: dict, affine: Affine, out_hw: tuple[int, int], min_visibility: float = DEFAULT_MIN_VISIBILITY
) -> dict:
    """``target`` (``boxes`` xyxy ``[N, 4]`` and per-box arrays such as ``classes``) through ``affine``,
    clipped to ``out_hw``; boxes keeping less than ``min_visibility`` of their area are dropped."""
    b = np.asarray(target["boxes"], dtype=np.float64).reshape(-1, 4)
    x = b[:, [0, 2]] * affine.sx + affine.tx
    y = b[:, [1, 3]] * affine.sy + affine.ty
    moved = np.stack([x.min(1), y.min(1), x.max(1), y.max(1)], axis=1)
    before = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    moved, keep = _clip(moved, before, out_hw, min_visibility)
    return _select(target, moved, keep)


def move_boxes_matrix(
    target: dict, matrix: np.ndarray, out_hw: tuple[int, int], min_visibility: float = DEFAULT_MIN_VISIBILITY
) -> dict:
    """Boxes through a general 2x3 map of pixel *indices* (OpenCV's convention, as ``warpAffine``
    takes, e.g. a rotation): each box becomes the axis-aligned box round its four moved corners."""
    b = np.asarray(target["boxes"], dtype=np.float64).reshape(-1, 4)
    xs = b[:, [0, 2, 2, 0]] - 0.5  # corners, as pixel-index coordinates
    ys = b[:, [1, 1, 3, 3]] - 0.5
    m = np.asarray(matrix, dtype=np.float64)
    mx = m[0, 0] * xs + m[0, 1] * ys + m[0, 2] + 0.5
    my = m[1, 0] * xs + m[1, 1] * ys + m[1, 2] + 0.5
    moved = np.stack([mx.min(1), my.min(1), mx.max(1), my.max(1)], axis=1)
    before = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    moved, keep = _clip(moved, before, out_hw, min_visibility)
    return _select(target, moved, keep)


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


def move_points(points: np.ndarray, affine: Affine, out_hw: tuple[int, int], flip_idx=None) -> np.ndarray:
    """``[N, K, 3]`` keypoints through ``affine`` into ``out_hw``: visibility kept, 0 (and the point
    clipped) where it leaves the image; left and right swapped by ``flip_idx`` on a mirror."""
    p = np.array(points, dtype=np.float64).reshape(-1, *np.shape(points)[1:])
    p[..., 0] = p[..., 0] * affine.sx + affine.tx
    p[..., 1] = p[..., 1] * affine.sy + affine.ty
    return points_outside(swap_points(p, affine.sx * affine.sy < 0, flip_idx), out_hw)


def move_points_matrix(
    points: np.ndarray, matrix: np.ndarray, out_hw: tuple[int, int], flip_idx=None
) -> np.ndarray:
    """Keypoints through a 2x3 map of pixel *indices* (``warpAffine``'s, as ``move_boxes_matrix``)."""
    p = np.array(points, dtype=np.float64).reshape(-1, *np.shape(points)[1:])
    m = np.asarray(matrix, dtype=np.float64)
    x, y = p[..., 0] - 0.5, p[..., 1] - 0.5
    p[..., 0] = m[0, 0] * x + m[0, 1] * y + m[0, 2] + 0.5
    p[..., 1] = m[1, 0] * x + m[1, 1] * y + m[1, 2] + 0.5
    mirrored = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0] < 0
    return points_outside(swap_points(p, mirrored, flip_idx), out_hw)


def nearest_rows(scale: float, shift: float, out: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``out`` output rows of the map ``y_out = scale * y + shift``: the source row under
    its centre, and whether that row lies inside a source of ``size`` rows."""
    centres = (np.arange(out, dtype=np.float64) + 0.5 - shift) / scale
    rows = np.floor(centres).astype(np.int64)
    inside = (rows >= 0) & (rows < size)
    return np.clip(rows, 0, max(size - 1, 0)), inside


def warp_mask(
    mask: np.ndarray, affine: Affine, out_hw: tuple[int, int], fill: int = 0, out: np.ndarray | None = None
) -> np.ndarray:
    """The class map ``mask [H, W]`` through ``affine`` into ``out_hw``: nearest source pixel under each
    output pixel's centre, ``fill`` where that falls outside the mask."""
    h, w = mask.shape
    rows, rin = nearest_rows(affine.sy, affine.ty, out_hw[0], h)
    cols, cin = nearest_rows(affine.sx, affine.tx, out_hw[1], w)
    if out is None:
        out = np.empty(out_hw, dtype=mask.dtype)
    np.take(np.take(mask, rows, axis=0), cols, axis=1, out=out)
    if not (rin.all() and cin.all()):
        out[~rin, :] = fill
        out[:, ~cin] = fill
    return out


def warp_mask_matrix(
    mask: np.ndarray, matrix: np.ndarray, out_hw: tuple[int, int], fill: int = 0
) -> np.ndarray:
    """The class map through a 2x3 map of pixel indices (``warpAffine``'s), nearest, ``fill`` outside."""
    return cv2.warpAffine(
        mask,
        np.asarray(matrix, dtype=np.float64),
        (out_hw[1], out_hw[0]),
        flags=cv2.INTER_NEAREST,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=int(fill),
    )


def warp_mask_map(
    mask: np.ndarray,
    matrix: np.ndarray,
    out_hw: tuple[int, int],
    fill: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The class map through a 3x3 map of continuous coordinates (an affine or perspective map, as
    pixels take it): the source pixel under each output pixel's centre, ``fill`` outside."""
    shift, unshift = np.eye(3), np.eye(3)
    shift[:2, 2], unshift[:2, 2] = 0.5, -0.5
    inverse = np.linalg.inv(unshift @ np.asarray(matrix, dtype=np.float64) @ shift)
    size, flags = (out_hw[1], out_hw[0]), cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP
    source = np.ascontiguousarray(mask)
    if np.allclose(inverse[2], (0.0, 0.0, 1.0), atol=1e-12):
        found = cv2.warpAffine(source, inverse[:2], size, flags=flags,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=int(fill))  # fmt: skip
    else:
        found = cv2.warpPerspective(source, inverse, size, flags=flags,
                                    borderMode=cv2.BORDER_CONSTANT, borderValue=int(fill))  # fmt: skip
    if out is None:
        return found
    out[...] = found
    return out
