"""Keypoints through a batch's geometry: the mover of a batch's points, as ``Draws.box_mover`` moves its boxes.

A keypoints field holds each object's ``K`` points ``(x, y, visibility)`` beside its box, in the
same continuous pixel coordinates. Each point goes through its sample's map (a mosaic's tile onto
its canvas first, then the sample's 3x3 map, divided through for a perspective map); a point that
leaves the output (or its mosaic tile, or passes a perspective map's horizon) gets visibility 0 and
is clipped to the output, as Ultralytics clips them; a map that mirrors (its determinant is
negative: a horizontal or vertical flip) swaps left and right by the field's ``flip_idx``. Which
objects stay is the boxes' decision (``min_visibility``, an IoU crop): the caller keeps the points
of the boxes that stay.
"""

from __future__ import annotations

import numpy as np
import torch

from ..image.geometry import move_boxes_matrix, move_points_matrix, points_outside, swap_points

__all__ = ["keypoint_mover", "move_points_through", "move_stage_points"]


def move_points_through(points: np.ndarray, matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[M, K, 3]`` points through ``matrices [M, 3, 3]`` (continuous coordinates, divided through):
    ``(moved float64 [M, K, 3], behind [M, K])``, ``behind`` where a point passes the map's horizon."""
    p = np.array(points, dtype=np.float64).reshape(len(matrices), -1, 3)
    m = np.asarray(matrices, dtype=np.float64)
    x, y = p[..., 0], p[..., 1]
    w = m[:, 2, 0, None] * x + m[:, 2, 1, None] * y + m[:, 2, 2, None]
    behind = w <= 1e-9
    w = np.where(behind, 1.0, w)
    mx = (m[:, 0, 0, None] * x + m[:, 0, 1, None] * y + m[:, 0, 2, None]) / w
    my = (m[:, 1, 0, None] * x + m[:, 1, 1, None] * y + m[:, 1, 2, None]) / w
    p[..., 0], p[..., 1] = mx, my
    return p, behind


def _general(g, points: np.ndarray, owner: np.ndarray, flip_idx) -> np.ndarray:
    """Points of rows ``owner`` of a read through ``g`` (``MapDraws``): a mosaic's tiles first."""
    owner = np.asarray(owner, dtype=np.int64)
    rows = g.mosaic.rows.max(initial=-1) + 1 if g.mosaic is not None else 0
    sample_of, tile_of = g.rows(max(int(owner.max(initial=-1)) + 1, len(g.matrices), int(rows)))
    j, t = sample_of[owner], tile_of[owner]
    p = np.array(points, dtype=np.float64).reshape(len(owner), -1, 3)
    gone = np.zeros(p.shape[:2], dtype=bool)
    if g.mosaic is not None and len(p):
        on = g.mosaic.on[j]
        placed, _ = move_points_through(p[on], g.mosaic.tiles[j[on], t[on]])
        x0, y0, x1, y1 = (g.mosaic.regions[j[on], t[on], k, None] for k in range(4))
        # a point of a tile's part cut off its region was never drawn: not in the mosaic
        gone[on] = (
            (placed[..., 0] < x0) | (placed[..., 0] > x1) | (placed[..., 1] < y0) | (placed[..., 1] > y1)
        )
        p[on] = placed
    p, behind = move_points_through(p, g.matrices[j]) if len(p) else (p, gone)
    p[..., 2][gone | behind] = 0.0
    p[..., 0][behind] = p[..., 1][behind] = -1.0  # outside: clipped below
    mirrored = np.linalg.det(g.matrices[j]) < 0 if len(p) else np.zeros(0, bool)
    return points_outside(swap_points(p, mirrored, flip_idx), g.out_size)


def keypoint_mover(draws):
    """``move(points [M, K, 3], owner [M], flip_idx) -> moved float32 [M, K, 3]``: a batch's points
    (object ``m`` of row ``owner[m]`` of the read, as ``Draws.box_mover`` takes its boxes) through
    their samples' maps; the objects stay in the order given (the boxes' mover says which stay)."""
    if draws.general is not None:
        return lambda points, owner, flip_idx: _general(draws.general, points, owner, flip_idx)

    def move(points, owner, flip_idx):
        sx, sy, tx, ty = draws.maps()
        owner = np.asarray(owner, dtype=np.int64)
        p = np.array(points, dtype=np.float64).reshape(len(owner), -1, 3)
        p[..., 0] = p[..., 0] * sx[owner, None] + tx[owner, None]
        p[..., 1] = p[..., 1] * sy[owner, None] + ty[owner, None]
        mirrored = (sx * sy < 0)[owner]
        return points_outside(swap_points(p, mirrored, flip_idx), draws.out_size)

    return move


def move_stage_points(stage, targets: list[dict], pairs: list, min_visibility: float) -> None:
    """The per-sample stage's maps (RandAugment's shears, translations, rotations) on each sample's
    points, in place, before ``StageDraws.move_boxes`` moves the boxes: ``pairs`` per keypoints field,
    ``(boxes key, points key, flip_idx)``; the points of a box that map drops are dropped with it."""
    for j, target in enumerate(targets):
        maps = stage.matrices(j)
        if not maps:
            continue
        for b, name, flip_idx in pairs:
            kind = type(target[name])
            boxes = {"boxes": np.asarray(target[b]), "i": np.arange(len(target[b]))}
            points = np.asarray(target[name], dtype=np.float32)
            for m in maps:
                boxes = move_boxes_matrix(boxes, m, stage.out_hw, min_visibility)
                points = move_points_matrix(points, m, stage.out_hw, flip_idx)
            points = np.ascontiguousarray(points[boxes["i"]])
            target[name] = torch.from_numpy(points) if kind is torch.Tensor else points
