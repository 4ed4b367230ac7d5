"""``keypoints``: each object's ``K`` points as float32 ``[N, K, 3]`` (x, y, visibility), one ``[K, 3]``
block per box of the boxes field it belongs to (``params["boxes"]``), in the same order.

Coordinates are the boxes' (continuous stored-image pixels, pixel ``i`` covering ``[i, i + 1)``);
visibility is COCO's: 0 not labelled (or moved out of the image), 1 labelled but hidden, 2 visible.
``params``: ``boxes`` (the boxes field's name), ``k`` (points per object), and when the source names
them ``names`` (K names), ``skeleton`` (pairs of point indices, from 0) and ``flip_idx`` (the point
each one becomes when the image is mirrored: left and right swapped).

Every read checks a shard's points once (finite, visibility 0, 1 or 2, ``k`` per object, one block
per box of its boxes field): a damaged shard is a CacheError, never a NaN in a pose loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import CacheError
from ..limits import short
from .base import ColumnReader, RaggedKind, column_name

__all__ = ["KeypointsKind", "points_problem", "beyond_image", "flip_pairs", "flip_problem", "MAX_KEYPOINTS"]

#: The most points an object may have (COCO-WholeBody has 133).
MAX_KEYPOINTS = 1024


def points_problem(points: np.ndarray, k: int | None = None) -> str | None:
    """What is wrong with ``[N, K, 3]`` points, or None: a shape other than ``k`` points per object, a
    coordinate that is not finite, a visibility other than 0, 1 or 2."""
    p = np.asarray(points)
    if p.ndim != 3 or p.shape[2] != 3 or (k is not None and p.shape[1] != k):
        return f"keypoints of shape {list(p.shape)}, not [N, {k if k is not None else 'K'}, 3]"
    if not np.isfinite(p).all():
        return "a keypoint that is not finite"
    v = p[..., 2]
    bad = (v != 0) & (v != 1) & (v != 2)
    if bad.any():
        return f"a keypoint visibility of {float(v[bad][0]):g}, not 0, 1 or 2"
    return None


def beyond_image(points: np.ndarray, height, width) -> np.ndarray:
    """Which stored points ``[..., K, 3]`` lie more than a pixel outside their ``height`` x ``width``
    image (numbers, or arrays that broadcast against ``[..., K]``): a build clips every point onto
    its image, so such a point is damage, for the readers and ``verify`` alike."""
    x, y = points[..., 0], points[..., 1]
    return (x < -1) | (y < -1) | (x > width + 1) | (y > height + 1)


def flip_pairs(names: Sequence[str]) -> list[int] | None:
    """``flip_idx`` from point names: ``left_x`` and ``right_x`` swap, as do ``l_x``/``r_x``, the
    side after the name (``x_left``, ``x_r``), other separators (``-``, ``.``, a space: MPII's
    ``r ankle``), ``leftEye``/``rightEye`` and ``left``/``right`` alone, in any case; the others
    stay. None when no name pairs up. A name given twice pairs with nothing: its partner would be a
    guess, and two points becoming one is no mirror."""
    lowered = [str(n).lower() for n in names]
    where = {n: i for i, n in enumerate(lowered) if lowered.count(n) == 1}
    out, paired = list(range(len(lowered))), False
    for i, n in enumerate(lowered):
        partner = next((m for m in _mirror_names(n) if m in where), None) if n in where else None
        if partner is not None:
            out[i], paired = where[partner], True
    return out if paired and flip_problem(out, len(out)) is None else None


def _mirror_names(n: str) -> list[str]:
    """The names the mirror image of point ``n`` (lower case) may have: its side word swapped."""
    found = []
    for a, b in (("left", "right"), ("right", "left"), ("l", "r"), ("r", "l")):
        if n == a:
            found.append(b)
        for sep in ("_", "-", ".", " ") + (("",) if len(a) > 1 else ()):  # "lhip": too many false pairs
            if n.startswith(a + sep) and len(n) > len(a + sep):
                found.append(b + sep + n[len(a + sep) :])
            if n.endswith(sep + a) and len(n) > len(sep + a):
                found.append(n[: -len(sep + a)] + sep + b)
    return found


def flip_problem(flip_idx: Sequence[int], k: int) -> str | None:
    """What is wrong with ``flip_idx`` (integers) for ``k`` points, or None: it must list each point
    index from 0 to ``k - 1`` once (a permutation), and, a mirror being its own undoing, send each
    point's image back to it (``flip_idx[flip_idx[i]] == i``). The one rule of builds, readers and
    ``verify``."""
    if len(flip_idx) != k:
        return f"it lists {len(flip_idx)} points, the keypoints have {k}"
    if sorted(flip_idx) != list(range(k)):
        bad = next(v for v in flip_idx if not 0 <= v < k or list(flip_idx).count(v) > 1)
        said = "is not one" if not 0 <= bad < k else "is there twice"
        return f"it must list each point index from 0 to {k - 1} once ({bad} {said})"
    for i, j in enumerate(flip_idx):
        if flip_idx[j] != i:
            return (
                f"point {i} becomes {j} but {j} becomes {flip_idx[j]}: a mirror swaps points in pairs "
                "(flip_idx[flip_idx[i]] == i)"
            )
    return None


def _index_list(value, k: int, where: str, what: str) -> list[int]:
    if (
        not isinstance(value, list)
        or len(value) != k
        or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < k for v in value)
    ):
        raise CacheError(f"{where}.{what}: expected {k} point indices in [0, {k}), got {short(value)}")
    return list(value)


class KeypointsKind(RaggedKind):
    kind = "keypoints"
    part, dtype = "points", "<f4"

    def check_params(self, params: dict, where: str) -> dict:
        boxes, k = params.get("boxes"), params.get("k")
        if not isinstance(boxes, str) or not boxes:
            raise CacheError(f"{where}.boxes: expected the name of a boxes field, got {short(boxes)}")
        if not isinstance(k, int) or isinstance(k, bool) or not 0 < k <= MAX_KEYPOINTS:
            raise CacheError(f"{where}.k: expected 1 to {MAX_KEYPOINTS} points per object, got {short(k)}")
        out: dict = {"boxes": boxes, "k": k}
        if params.get("names") is not None:
            names = params["names"]
            if not isinstance(names, list) or len(names) != k or not all(isinstance(n, str) for n in names):
                raise CacheError(f"{where}.names: expected {k} point names, got {short(names)}")
            out["names"] = list(names)
        if params.get("skeleton") is not None:
            edges = params["skeleton"]
            if not isinstance(edges, list) or len(edges) > 4 * MAX_KEYPOINTS:
                raise CacheError(f"{where}.skeleton: expected a list of point pairs, got {short(edges)}")
            for e in edges:
                if (
                    not isinstance(e, list)
                    or len(e) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < k for v in e)
                ):
                    raise CacheError(
                        f"{where}.skeleton: expected pairs of point indices below {k}, got {short(e)}"
                    )
            out["skeleton"] = [list(e) for e in edges]
        if params.get("flip_idx") is not None:
            out["flip_idx"] = _index_list(params["flip_idx"], k, where, "flip_idx")
            problem = flip_problem(out["flip_idx"], k)
            if problem:  # a point twice, or [1, 2, 0]: a mirrored sample's points would not be its own
                raise CacheError(f"{where}.flip_idx: {problem}")
        return out

    def tail(self, params: dict) -> tuple[int, ...]:
        return (params["k"], 3)

    def encode(self, value: Any, params: dict) -> np.ndarray:
        return np.asarray(value, dtype=np.float32).reshape(-1, params["k"], 3)

    def gather(
        self, name: str, params: dict, column: ColumnReader, rows: Sequence[int], samples: int, memo=None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(counts, points [M, K, 3])``: each row's number of objects and their points back to back,
        the shard's points checked first."""
        self._check(name, params, column, samples, memo)
        counts, points = super().gather(name, params, column, rows, samples, memo)
        return counts, np.asarray(points, dtype=np.float32).reshape(-1, params["k"], 3)

    def _check(self, name: str, params: dict, column: ColumnReader, samples: int, memo) -> None:
        """The whole shard's points (once, with a ``memo``): finite, visibility 0/1/2, ``k`` per object,
        one block per box of the boxes field."""
        if memo is not None and ("checked", name) in memo:
            return
        ends = np.asarray(column(column_name(name, "offsets"), slice(None)))
        points = np.asarray(column(column_name(name, "points"), slice(None)))
        boxes = np.asarray(column(column_name(params["boxes"], "offsets"), slice(None)))
        problem = None
        if ends.shape != boxes.shape or (ends != boxes).any():
            problem = f"its objects do not match the boxes of {params['boxes']!r} one to one"
        else:
            problem = points_problem(points.reshape(len(points), *points.shape[1:]), params["k"])
        if problem:
            raise CacheError(
                f"field {name!r}: a stored value is out of range ({problem}): the shard is damaged"
            )
        if memo is not None:
            memo[("checked", name)] = True
