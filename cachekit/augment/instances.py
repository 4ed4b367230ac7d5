"""One carrier for a batch's objects, and one mover per target kind (Ultralytics' ``Instances`` is the model).

``Instances`` holds the objects of one boxes field flat, as the shards store them: xyxy ``boxes
[M, 4]`` with their ``classes`` and ``iscrowd`` flags, each keypoints field's ``[M, K, 3]`` points
(x, y, visibility) with its ``flip_idx``, and ``owner [M]``: the row of the batch's read each object
belongs to (a mosaic's extra rows come after the samples). Whatever moves the objects keeps them
together: a box that is dropped takes its label, crowd flag and keypoints with it.

The movers, one per kind, take each sample's 3x3 map in continuous coordinates and its output size
(``geometry``: a ``maps.MapDraws``, with a mosaic's tiles and an IoU crop's rule when the list has them):

- ``move_boxes``: the box round its four moved corners (a mosaic's tile onto its canvas first, the
  part of it cut off the canvas gone), clipped to the output, dropped when it keeps less than
  ``min_visibility`` of its area, or its centre leaves an IoU crop;
- ``move_points``: each point through the same map, visibility 0 (and clipped) where it leaves the
  output, its tile's region or passes a perspective map's horizon; left and right swapped by
  ``flip_idx`` where the map mirrors (a negative determinant);
- ``move_mask``: a class map sampled nearest through the map, 0 outside (the crop+resize path's
  separable ``Affine`` row by row, as its pixels are taken; a general map with OpenCV).

``Instances.staged`` and ``stage_mask`` move one sample's objects and class map through the
per-sample stage's 2x3 maps of pixel indices (RandAugment's shears, translations, rotations), in order.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..image.geometry import (
    Affine,
    _clip,
    move_boxes_matrix,
    move_points_matrix,
    points_outside,
    swap_points,
    warp_mask,
    warp_mask_map,
    warp_mask_matrix,
)
from .maps import MapDraws
from .matrices import box_corners

__all__ = ["Instances", "move_boxes", "move_points", "move_mask", "stage_mask", "sample_geometry"]


@dataclass(frozen=True)
class Instances:
    """A batch's (or a sample's) objects of one boxes field: see the module's description.

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

    def moved(self, geometry, min_visibility: float) -> Instances:
        """Every object through its sample's map (``geometry``): boxes and points moved, the objects
        whose box is dropped left out, ``owner`` now each one's sample, in the samples' order (a
        mosaic's objects: its own, then its tiles' in order)."""
        boxes, keep, sample = move_boxes(self.boxes, self.owner, geometry, min_visibility)
        points = tuple(
            (name, move_points(p, self.owner, geometry, flip_idx), flip_idx) for name, p, flip_idx in self.points
        )
        moved = Instances(boxes, self.classes, self.iscrowd, sample, points).select(keep)
        return moved.select(np.argsort(moved.owner, kind="stable"))

    def staged(self, maps: Sequence[np.ndarray], out_hw: tuple[int, int], min_visibility: float) -> Instances:
        """One sample's objects through ``maps``, 2x3 maps of pixel indices (``warpAffine``'s), in
        order: after each, boxes clipped and those keeping less than ``min_visibility`` dropped."""
        if not len(maps):
            return self
        part = {"boxes": np.asarray(self.boxes), "i": np.arange(len(self))}
        points = [np.asarray(p, dtype=np.float32) for _, p, _ in self.points]
        for m in maps:
            part = move_boxes_matrix(part, m, out_hw, min_visibility)
            points = [move_points_matrix(p, m, out_hw, f) for p, (_, _, f) in zip(points, self.points)]
        i = part["i"]
        return Instances(
            part["boxes"],
            np.asarray(self.classes)[i],
            np.asarray(self.iscrowd)[i],
            np.asarray(self.owner)[i],
            tuple((name, np.ascontiguousarray(p[i]), f) for p, (name, _, f) in zip(points, self.points)),
        )

    def spans(self, n: int) -> list[tuple[int, int]]:
        """Each of ``n`` owners' ``[start, end)`` among the objects (sorted by owner)."""
        ends = np.cumsum(np.bincount(self.owner, minlength=n)[:n]).tolist()
        return list(zip([0, *ends[:-1]], ends))


def _samples(geometry, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each object's sample and tile (0: the sample's own image; k: its mosaic's k-th extra row)."""
    mosaic = geometry.mosaic
    rows = mosaic.rows.max(initial=-1) + 1 if mosaic is not None else 0
    sample_of, tile_of = geometry.rows(max(int(owner.max(initial=-1)) + 1, len(geometry.matrices), int(rows)))
    return sample_of[owner], tile_of[owner]


def move_boxes(
    boxes: np.ndarray, owner: np.ndarray, geometry, min_visibility: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """xyxy ``boxes [M, 4]`` of rows ``owner`` through their samples' maps (a mosaic's tiles first,
    clipped to its canvas): ``(moved float32 [M, 4], keep [M], sample [M])``."""
    b = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    owner = np.asarray(owner, dtype=np.int64)
    j, t = _samples(geometry, owner)
    keep = np.ones(len(b), dtype=bool)
    mosaic = geometry.mosaic
    if mosaic is not None and len(b):
        on = mosaic.on[j]
        placed = box_corners(b[on], mosaic.tiles[j[on], t[on]])
        size = mosaic.canvas
        placed, inside = _clip(placed, np.zeros(len(placed)), (size, size), 0.0)
        b[on] = placed
        keep[np.flatnonzero(on)[~inside]] = False
    if geometry.keep_rects is not None and len(b):  # an IoU crop keeps the boxes whose centres it holds
        centre = box_corners(b, geometry.keep_maps[j])
        cx, cy = (centre[:, 0] + centre[:, 2]) / 2, (centre[:, 1] + centre[:, 3]) / 2
        r = geometry.keep_rects[j]
        keep &= np.isnan(r[:, 0]) | ((r[:, 0] < cx) & (cx < r[:, 2]) & (r[:, 1] < cy) & (cy < r[:, 3]))
    moved = box_corners(b, geometry.matrices[j]) if len(b) else np.zeros((0, 4))
    before = (moved[:, 2] - moved[:, 0]) * (moved[:, 3] - moved[:, 1])
    moved, visible = _clip(moved, before, geometry.out_size, min_visibility)
    moved = moved.astype(np.float32)
    # a box just past the edge clips to a sliver of rounding error (1e-14 px): none once float32
    visible &= (moved[:, 2] > moved[:, 0]) & (moved[:, 3] > moved[:, 1])
    return moved, keep & visible, j


def _as_points(points, m: int) -> np.ndarray:
    """``points`` as a new float64 ``[m, K, 3]`` (no objects as ``[0, K, 3]``, not a reshape error),
    given per point ``[m, K, 3]`` or flat per object ``[m, K * 3]``."""
    p = np.array(points, dtype=np.float64)
    k = p.shape[1] if p.ndim == 3 else p.shape[1] // 3 if p.ndim == 2 else p.size // (3 * m) if m else 0
    return p.reshape(m, k, 3)


def _through(points: np.ndarray, matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[M, K, 3]`` points through ``matrices [M, 3, 3]`` (divided through): ``(moved float64,
    behind [M, K])``, ``behind`` where a point passes the map's horizon."""
    p = _as_points(points, len(matrices))
    m = np.asarray(matrices, dtype=np.float64)
    x, y = p[..., 0], p[..., 1]
    w = m[:, 2, 0, None] * x + m[:, 2, 1, None] * y + m[:, 2, 2, None]
    behind = w <= 1e-9
    w = np.where(behind, 1.0, w)
    mx = (m[:, 0, 0, None] * x + m[:, 0, 1, None] * y + m[:, 0, 2, None]) / w
    my = (m[:, 1, 0, None] * x + m[:, 1, 1, None] * y + m[:, 1, 2, None]) / w
    p[..., 0], p[..., 1] = mx, my
    return p, behind


def move_points(points: np.ndarray, owner: np.ndarray, geometry, flip_idx=None) -> np.ndarray:
    """``[M, K, 3]`` points of the objects of rows ``owner`` through their samples' maps (a mosaic's
    tile first): float32 ``[M, K, 3]``, in the objects' order."""
    owner = np.asarray(owner, dtype=np.int64)
    j, t = _samples(geometry, owner)
    p = _as_points(points, len(owner))
    gone = np.zeros(p.shape[:2], dtype=bool)
    mosaic = geometry.mosaic
    on = mosaic.on[j] if mosaic is not None else np.zeros(len(p), bool)
    if on.any():  # some of these objects are a mosaic's
        placed, _ = _through(p[on], mosaic.tiles[j[on], t[on]])
        x0, y0, x1, y1 = (mosaic.regions[j[on], t[on], k, None] for k in range(4))
        # a point of a tile's part cut off its region was never drawn: not in the mosaic
        gone[on] = (placed[..., 0] < x0) | (placed[..., 0] > x1) | (placed[..., 1] < y0) | (placed[..., 1] > y1)
        p[on] = placed
    p, behind = _through(p, geometry.matrices[j]) if len(p) else (p, gone)
    p[..., 2][gone | behind] = 0.0
    p[..., 0][behind] = p[..., 1][behind] = -1.0  # outside: clipped below
    mirrored = np.linalg.det(geometry.matrices[j]) < 0 if len(p) else np.zeros(0, bool)
    if flip_idx is None and p.shape[1] > 1 and mirrored.any():
        _warn_unpaired(p.shape[1])
    return points_outside(swap_points(p, mirrored, flip_idx), geometry.out_size)


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
        stacklevel=2,
    )


def move_mask(
    mask: np.ndarray, where: Affine | np.ndarray, out_hw: tuple[int, int], out: np.ndarray | None = None
) -> np.ndarray:
    """A class map through ``where`` into ``out_hw``, nearest, 0 outside: the crop+resize path's
    ``Affine`` (separable, row by row), or a sample's 3x3 map; written into ``out`` when given."""
    if isinstance(where, Affine):
        return warp_mask(mask, where, out_hw, fill=0, out=out)
    return warp_mask_map(mask, where, out_hw, fill=0, out=out)


def stage_mask(mask: np.ndarray, maps: Sequence[np.ndarray], out_hw: tuple[int, int]) -> None:
    """A class map through the per-sample stage's ``maps`` (2x3 of pixel indices, ``warpAffine``'s)
    in order, nearest, 0 where uncovered; in place (a row of the batch's mask buffer)."""
    for m in maps:
        mask[...] = warp_mask_matrix(mask, m, out_hw, fill=0)


def sample_geometry(where: Affine | np.ndarray, out_hw: tuple[int, int]) -> MapDraws:
    """One sample's map as the movers take it (``geometry``), from an ``Affine`` or a 3x3 map."""
    if isinstance(where, Affine):
        m = np.eye(3)
        m[0, 0], m[1, 1], m[0, 2], m[1, 2] = where.sx, where.sy, where.tx, where.ty
    else:
        m = np.asarray(where, dtype=np.float64).reshape(3, 3)
    return MapDraws(m[None], np.zeros((1, 2), np.int64), (int(out_hw[0]), int(out_hw[1])))
