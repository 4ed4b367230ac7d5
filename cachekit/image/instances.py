"""One carrier for a sample's (or a batch's) objects, and one mover per target kind, for both sides of a
cache: the build's recipes and offline variants, and read-time augmentation (Ultralytics'
``Instances`` is the model).

``Instances`` holds the objects of one boxes field flat: xyxy ``boxes [M, 4]`` with their ``classes``
and ``iscrowd`` flags, each keypoints field's ``[M, K, 3]`` points (x, y, visibility) with its
``flip_idx``, and ``owner [M]``: the sample (or a batch's row) each belongs to. Whatever moves the
objects keeps them together: a box that is dropped takes its label, crowd flag and keypoints with it.

Every map is one convention: a 3x3 matrix in continuous coordinates, pixel ``i`` covering
``[i, i + 1)`` (``image.geometry``; an ``Affine`` is ``as_matrix()``, a ``warpAffine`` map of pixel
indices is ``from_pixel_indices()`` once, where it is drawn). The movers, one per kind:

- ``move_boxes``: the box round each box's four moved corners (divided through a perspective map),
  clipped to the output, dropped when it keeps less than ``min_visibility`` of its area or nothing;
- ``move_points``: each point through its object's map, visibility 0 (and clipped) where it leaves
  the output or passes the map's horizon; left and right swapped by ``flip_idx`` where the map
  mirrors (a negative determinant);
- ``move_mask``: a class map sampled nearest at each output pixel's centre, 0 outside: separably
  row by row for an ``Affine`` (the crop+resize path takes its pixels so), with OpenCV for a 3x3 map.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from .geometry import Affine, nearest_rows, points_outside, swap_points

__all__ = [
    "Instances",
    "as_points",
    "box_corners",
    "clip_boxes",
    "from_pixel_indices",
    "move_boxes",
    "move_mask",
    "move_points",
    "points_through",
]


@dataclass(frozen=True)
class Instances:
    """Objects of one boxes field (see the module's description).

    ``points``: ``((name, [M, K, 3], flip_idx), ...)``, one per keypoints field of these boxes."""

    boxes: np.ndarray
    classes: np.ndarray
    iscrowd: np.ndarray
    owner: np.ndarray
    points: tuple = ()

    def __len__(self) -> int:
        return len(self.boxes)

    def select(self, keep) -> Instances:
        """The objects ``keep`` picks (a mask or indices), each with all of its parts."""
        return Instances(
            self.boxes[keep],
            self.classes[keep],
            self.iscrowd[keep],
            self.owner[keep],
            tuple((name, p[keep], flip_idx) for name, p, flip_idx in self.points),
        )

    def through(
        self,
        matrices: np.ndarray,
        out_hw: tuple[int, int],
        min_visibility: float,
        gone: Sequence[np.ndarray] | None = None,
        warn: bool = False,
    ) -> Instances:
        """Every object through its own map (``matrices [M, 3, 3]``, or one ``[3, 3]`` for all) into
        ``out_hw``: boxes clipped, the objects whose box is dropped left out with all their parts.
        ``gone``: per keypoints field, ``[M, K]`` points already known to be lost (visibility 0);
        ``warn``: say once when points are mirrored with no ``flip_idx``."""
        m = np.asarray(matrices, dtype=np.float64)
        if m.ndim == 2:
            m = np.broadcast_to(m, (len(self), 3, 3))
        boxes, keep = move_boxes(self.boxes, m, out_hw, min_visibility)
        points = tuple(
            (name, move_points(p, m, out_hw, flip_idx, None if gone is None else gone[i], warn), flip_idx)
            for i, (name, p, flip_idx) in enumerate(self.points)
        )
        return Instances(boxes, self.classes, self.iscrowd, self.owner, points).select(keep)

    def through_each(self, maps: Sequence[np.ndarray], out_hw: tuple[int, int], min_visibility: float) -> Instances:
        """All the objects through each of ``maps`` (3x3, one for all) in order, into ``out_hw`` each
        time: boxes clipped and dropped after every one (a per-sample stage's shears and rotations)."""
        out = self
        for m in maps:
            out = out.through(m, out_hw, min_visibility)
        return out

    @staticmethod
    def concat(parts: Sequence[Instances], like: Instances) -> Instances:
        """``parts`` one after another (``like``: of the same field, its points' names and dtypes for none)."""
        parts = list(parts) or [like.select(np.zeros(0, np.int64))]
        return Instances(
            np.concatenate([p.boxes for p in parts]),
            np.concatenate([p.classes for p in parts]),
            np.concatenate([p.iscrowd for p in parts]),
            np.concatenate([p.owner for p in parts]),
            tuple(
                (name, np.concatenate([p.points[i][1] for p in parts]), flip_idx)
                for i, (name, _, flip_idx) in enumerate(like.points)
            ),
        )

    def spans(self, n: int) -> list[tuple[int, int]]:
        """Each of ``n`` owners' ``[start, end)`` among the objects (sorted by owner)."""
        ends = np.cumsum(np.bincount(self.owner, minlength=n)[:n]).tolist()
        return list(zip([0, *ends[:-1]], ends))


def from_pixel_indices(matrix: np.ndarray) -> np.ndarray:
    """A 2x3 (or 3x3) map of pixel indices, as ``warpAffine`` takes it, as the one convention: a 3x3
    map of continuous coordinates (pixel ``i``'s centre is ``i + 0.5``)."""
    m = np.eye(3)
    m[: np.shape(matrix)[0]] = np.asarray(matrix, dtype=np.float64)
    shift, unshift = np.eye(3), np.eye(3)
    shift[:2, 2], unshift[:2, 2] = 0.5, -0.5
    return shift @ m @ unshift


def box_corners(boxes: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """xyxy ``boxes [M, 4]`` through ``matrices [M, 3, 3]``: the box round each one's four moved corners."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    xs, ys = b[:, [0, 2, 2, 0]], b[:, [1, 1, 3, 3]]
    m = matrices
    w = m[:, 2, 0, None] * xs + m[:, 2, 1, None] * ys + m[:, 2, 2, None]
    behind = (w <= 1e-9).any(axis=1)  # a corner past the map's horizon: no box round it is true
    w = np.where(w <= 1e-9, 1e-9, w)
    mx = (m[:, 0, 0, None] * xs + m[:, 0, 1, None] * ys + m[:, 0, 2, None]) / w
    my = (m[:, 1, 0, None] * xs + m[:, 1, 1, None] * ys + m[:, 1, 2, None]) / w
    out = np.stack([mx.min(1), my.min(1), mx.max(1), my.max(1)], axis=1)
    out[behind] = 0.0  # an empty box: dropped as one that keeps nothing
    return out


def clip_boxes(boxes: np.ndarray, before: np.ndarray, out_hw: tuple[int, int], min_visibility: float) -> tuple:
    """Clip ``[N, 4]`` xyxy boxes to the output, in place; which boxes keep enough of their ``before``
    area (and some area at all)."""
    h, w = out_hw
    boxes[:, [0, 2]] = np.clip(boxes[:, [0, 2]], 0, w)
    boxes[:, [1, 3]] = np.clip(boxes[:, [1, 3]], 0, h)
    after = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep = (after > 0) & (after >= min_visibility * before)
    return boxes, keep


def move_boxes(
    boxes: np.ndarray, matrices: np.ndarray, out_hw: tuple[int, int], min_visibility: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each box through its map into ``out_hw``: ``(moved float32 [M, 4], kept [M])``, a box kept when it
    holds at least ``min_visibility`` of its moved area after clipping (and some of it at all)."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    moved = box_corners(b, matrices) if len(b) else np.zeros((0, 4))
    before = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    moved, visible = clip_boxes(moved, before, out_hw, min_visibility)
    moved = moved.astype(np.float32)
    # a box just past the edge clips to a sliver of rounding error (1e-14 px): none once float32
    visible &= (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
    return moved, visible


def as_points(points, m: int) -> np.ndarray:
    """``points`` as a new float64 ``[m, K, 3]`` (no objects as ``[0, K, 3]``, not a reshape error),
    given per point ``[m, K, 3]`` or flat per object ``[m, K * 3]``."""
    p = np.array(points, dtype=np.float64)
    k = p.shape[1] if p.ndim == 3 else p.shape[1] // 3 if p.ndim == 2 else p.size // (3 * m) if m else 0
    return p.reshape(m, k, 3)


def points_through(points: np.ndarray, matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[M, K, 3]`` points through ``matrices [M, 3, 3]`` (divided through): ``(moved float64,
    behind [M, K])``, ``behind`` where a point passes the map's horizon."""
    p = as_points(points, len(matrices))
    m = np.asarray(matrices, dtype=np.float64)
    x, y = p[..., 0], p[..., 1]
    w = m[:, 2, 0, None] * x + m[:, 2, 1, None] * y + m[:, 2, 2, None]
    behind = w <= 1e-9
    w = np.where(behind, 1.0, w)
    mx = (m[:, 0, 0, None] * x + m[:, 0, 1, None] * y + m[:, 0, 2, None]) / w
    my = (m[:, 1, 0, None] * x + m[:, 1, 1, None] * y + m[:, 1, 2, None]) / w
    p[..., 0], p[..., 1] = mx, my
    return p, behind


def move_points(
    points: np.ndarray,
    matrices: np.ndarray,
    out_hw: tuple[int, int],
    flip_idx=None,
    gone: np.ndarray | None = None,
    warn: bool = False,
) -> np.ndarray:
    """``[M, K, 3]`` points (or ``[M, K * 3]``), each object's through its map into ``out_hw``: float32
    ``[M, K, 3]``; ``gone [M, K]``: points already lost (visibility 0)."""
    p = as_points(points, len(matrices))
    p, behind = points_through(p, matrices) if len(p) else (p, np.zeros(p.shape[:2], bool))
    lost = behind if gone is None else gone | behind
    p[..., 2][lost] = 0.0
    p[..., 0][behind] = p[..., 1][behind] = -1.0  # outside: clipped below
    mirrored = np.linalg.det(matrices) < 0 if len(p) else np.zeros(0, bool)
    if warn and flip_idx is None and p.shape[1] > 1 and mirrored.any():
        _warn_unpaired(p.shape[1])
    return points_outside(swap_points(p, mirrored, flip_idx), out_hw)


_warned_unpaired = False


def _warn_unpaired(k: int) -> None:
    """Once a process: points mirrored with no ``flip_idx`` keep their indices, so a person's left
    wrist is labelled on the right side of the mirrored image (Ultralytics turns its flips off then)."""
    global _warned_unpaired
    if _warned_unpaired:
        return
    _warned_unpaired = True
    warnings.warn(
        f"keypoints ({k} a box) were mirrored by a flip, and their field has no flip_idx: each point keeps "
        "its index, so left and right are not swapped; build with flip_idx= (--flip-idx; 0, 1, 2, ... "
        "when no point has a mirror partner) or keypoint_names= with left_/right_ names",
        UserWarning,
        stacklevel=3,
    )


def move_mask(
    mask: np.ndarray, where: Affine | np.ndarray, out_hw: tuple[int, int], out: np.ndarray | None = None
) -> np.ndarray:
    """A class map through ``where`` into ``out_hw``, nearest at each output pixel's centre, 0 outside:
    an ``Affine`` separably, row by row (as the crop+resize path takes its pixels), a 3x3 map with
    OpenCV; written into ``out`` when given."""
    if isinstance(where, Affine):
        h, w = mask.shape
        rows, rin = nearest_rows(where.sy, where.ty, out_hw[0], h)
        cols, cin = nearest_rows(where.sx, where.tx, out_hw[1], w)
        if out is None:
            out = np.empty(out_hw, dtype=mask.dtype)
        np.take(np.take(mask, rows, axis=0), cols, axis=1, out=out)
        if not (rin.all() and cin.all()):
            out[~rin, :] = 0
            out[:, ~cin] = 0
        return out
    shift, unshift = np.eye(3), np.eye(3)
    shift[:2, 2], unshift[:2, 2] = 0.5, -0.5
    inverse = np.linalg.inv(unshift @ np.asarray(where, dtype=np.float64) @ shift)
    size, flags = (out_hw[1], out_hw[0]), cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP
    source = np.ascontiguousarray(mask)
    if np.allclose(inverse[2], (0.0, 0.0, 1.0), atol=1e-12):
        found = cv2.warpAffine(source, inverse[:2], size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    else:
        found = cv2.warpPerspective(source, inverse, size, flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    if out is None:
        return found
    out[...] = found
    return out
