"""The carrier's movers seen per object, as the tests of mosaics, IoU crops and general maps ask them:
every object's moved box with whether it stays, and every object's points (none left out)."""

from __future__ import annotations

import numpy as np

from cachekit.image import instances as carrier
from cachekit.image.instances import Instances


def _objects(boxes, owner, points=()) -> Instances:
    owner = np.asarray(owner, dtype=np.int64)
    n = len(owner)
    return Instances(np.asarray(boxes, dtype=np.float64).reshape(n, 4), np.zeros(n), np.zeros(n), owner, points)


def move_boxes(boxes, owner, geometry, min_visibility: float):
    """``(moved float32 [M, 4], keep [M], sample [M])`` for every object of rows ``owner``."""
    placed, keep, _ = geometry.place(_objects(boxes, owner))
    moved, visible = carrier.move_boxes(placed.boxes, geometry.matrices[placed.owner], geometry.out_size, min_visibility)
    return moved, keep & visible, placed.owner


def move_points(points, owner, geometry, flip_idx=None):
    """Every object's points (float32 ``[M, K, 3]``) of rows ``owner``, through their samples' maps."""
    n = len(np.asarray(owner))
    placed, _, gone = geometry.place(_objects(np.zeros((n, 4)), owner, (("points", points, flip_idx),)))
    matrices = geometry.matrices[placed.owner]
    return carrier.move_points(placed.points[0][1], matrices, geometry.out_size, flip_idx, gone[0])
