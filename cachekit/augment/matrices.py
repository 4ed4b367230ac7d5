"""Each geometric transform as one 3x3 map per sample, drawn for a whole batch at once.

A list with a rotation, an affine or perspective map, a vertical flip, a zoom-out, an IoU crop or a
mosaic is drawn here (``draw_maps``): every step's matrix, in the list's order, multiplies the map
so far, from the sample's pixel source (its stored image, or its mosaic canvas) to the current
view, whose size each step also sets. Coordinates are continuous, pixel ``i`` covering ``[i, i+1)``
(``cachekit.image.geometry``). Crops are part of the one map: they clip nothing on their own, so
what a crop left out can come back into view when a later step (a zoom-out, a rotation) shows
beyond its edges, where torchvision's chain would show ``fill``; boxes and masks follow the same
one map, so they stay on their pixels either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .draws import uniforms
from .geometric import degrees_range

if TYPE_CHECKING:
    from .geometric import (
        RandomAffine,
        RandomIoUCrop,
        RandomPerspective,
        RandomRotation,
        RandomVerticalFlip,
        RandomZoomOut,
    )

__all__ = [
    "eye",
    "crop_matrices",
    "affine_matrices",
    "rotation",
    "affine",
    "perspective",
    "zoom_out",
    "iou_crop",
    "vertical_flip",
    "box_corners",
    "draw_uniforms",
    "shrink_sizes",
    "is_axis_aligned",
    "as_boxes",
]


def eye(n: int) -> np.ndarray:
    return np.tile(np.eye(3), (n, 1, 1))


def crop_matrices(top, left, height, width, out_h, out_w) -> np.ndarray:
    """The boxes ``(top, left, height, width)`` of the view onto ``out_h x out_w`` views."""
    n = len(top)
    m = eye(n)
    sx, sy = np.asarray(out_w) / width, np.asarray(out_h) / height
    m[:, 0, 0], m[:, 1, 1] = sx, sy
    m[:, 0, 2], m[:, 1, 2] = -left * sx, -top * sy
    return m


def _translation(tx, ty) -> np.ndarray:
    m = eye(len(tx))
    m[:, 0, 2], m[:, 1, 2] = tx, ty
    return m


def affine_matrices(angle, tx, ty, scale, shear_x, shear_y, cx, cy) -> np.ndarray:
    """torchvision's ``affine`` forward map, ``T * C * RSS * C^-1``, for arrays of parameters: a
    clockwise rotation by ``angle`` degrees, then ``scale``, x and y shears in degrees, about the
    centre ``(cx, cy)``, then a shift by ``(tx, ty)``."""
    rot, sx, sy = np.radians(angle), np.radians(shear_x), np.radians(shear_y)
    a = np.cos(rot - sy) / np.cos(sy)
    b = -np.cos(rot - sy) * np.tan(sx) / np.cos(sy) - np.sin(rot)
    c = np.sin(rot - sy) / np.cos(sy)
    d = -np.sin(rot - sy) * np.tan(sx) / np.cos(sy) + np.cos(rot)
    m = eye(len(angle))
    m[:, 0, 0], m[:, 0, 1], m[:, 1, 0], m[:, 1, 1] = a * scale, b * scale, c * scale, d * scale
    return _translation(cx + tx, cy + ty) @ m @ _translation(-cx, -cy)


def vertical_flip(step: RandomVerticalFlip, u: np.ndarray, vh: np.ndarray) -> np.ndarray:
    flip = u[:, 0] < step.p
    m = eye(len(vh))
    m[flip, 1, 1], m[flip, 1, 2] = -1.0, vh[flip]
    return m


def rotation(step: RandomRotation, u: np.ndarray, vh: np.ndarray, vw: np.ndarray):
    """torchvision's ``RandomRotation``: counter-clockwise by an angle uniform in ``degrees``;
    ``expand`` grows the view to the rotated image's bounds (torchvision's rounding) about its centre.
    Returns (matrices, new heights, new widths)."""
    lo, hi = degrees_range(step.degrees, "RandomRotation")
    angle = lo + u[:, 0] * (hi - lo)
    n, zeros, ones = len(vh), np.zeros(len(vh)), np.ones(len(vh))
    if step.center is not None and not step.expand:
        cx, cy = np.full(n, float(step.center[0])), np.full(n, float(step.center[1]))
    else:
        cx, cy = vw / 2, vh / 2
    m = affine_matrices(-angle, zeros, zeros, ones, zeros, zeros, cx, cy)
    if not step.expand:
        return m, vh, vw
    corners = np.stack(
        [[-vw / 2, -vh / 2], [vw / 2, -vh / 2], [vw / 2, vh / 2], [-vw / 2, vh / 2]]
    )  # [4,2,n]
    lin = m[:, :2, :2]
    moved = np.einsum("nij,knj->kni", lin, corners.transpose(0, 2, 1))  # [4, n, 2]
    tol = 1e-4
    hi_ = np.ceil(np.trunc(moved.max(0) / tol) * tol)
    lo_ = np.floor(np.trunc(moved.min(0) / tol) * tol)
    nw, nh = (hi_ - lo_)[:, 0], (hi_ - lo_)[:, 1]
    shift = _translation(nw / 2 - vw / 2, nh / 2 - vh / 2)
    return shift @ m, nh, nw


def affine(step: RandomAffine, u: np.ndarray, vh: np.ndarray, vw: np.ndarray) -> np.ndarray:
    """torchvision's ``RandomAffine.get_params`` and its map about the view's centre; Ultralytics'
    perspective terms (``step.perspective``) act on the centred coordinates, as its
    ``RandomPerspective`` puts them (between centring and rotation)."""
    lo, hi = degrees_range(step.degrees, "RandomAffine")
    angle = lo + u[:, 0] * (hi - lo)
    zeros = np.zeros(len(vh))
    tx = ty = zeros
    if step.translate is not None:
        dx, dy = step.translate[0] * vw, step.translate[1] * vh
        tx, ty = np.round(-dx + u[:, 1] * 2 * dx), np.round(-dy + u[:, 2] * 2 * dy)
    scale = np.ones(len(vh))
    if step.scale is not None:
        scale = step.scale[0] + u[:, 3] * (step.scale[1] - step.scale[0])
    x0, x1, y0, y1 = step.shear_ranges
    shear_x, shear_y = x0 + u[:, 4] * (x1 - x0), y0 + u[:, 5] * (y1 - y0)
    cx, cy = vw / 2, vh / 2
    m = affine_matrices(angle, tx, ty, scale, shear_x, shear_y, cx, cy)
    if step.perspective:
        p = eye(len(vh))
        p[:, 2, 0] = (2 * u[:, 6] - 1) * step.perspective
        p[:, 2, 1] = (2 * u[:, 7] - 1) * step.perspective
        m = m @ _translation(cx, cy) @ p @ _translation(-cx, -cy)
    return m


def _randint(u: np.ndarray, low, high) -> np.ndarray:
    """``torch.randint(low, high)`` from uniforms: an integer in ``[low, high)``."""
    return low + np.floor(u * (high - low))


def perspective(step: RandomPerspective, u: np.ndarray, vh: np.ndarray, vw: np.ndarray) -> np.ndarray:
    """torchvision's ``RandomPerspective``: each corner moved inwards by up to ``distortion_scale`` of
    half the side (whole pixels), applied with probability ``p``; the homography taking the
    corners ``(0, 0), (w-1, 0), (w-1, h-1), (0, h-1)`` to the moved ones."""
    import cv2

    n = len(vh)
    out = eye(n)
    half_h, half_w = np.floor(vh / 2), np.floor(vw / 2)
    bh = np.floor(step.distortion_scale * half_h) + 1
    bw = np.floor(step.distortion_scale * half_w) + 1
    ends = np.stack(
        [
            np.stack([_randint(u[:, 1], 0, bw), _randint(u[:, 2], 0, bh)], 1),
            np.stack([_randint(u[:, 3], vw - bw, vw), _randint(u[:, 4], 0, bh)], 1),
            np.stack([_randint(u[:, 5], vw - bw, vw), _randint(u[:, 6], vh - bh, vh)], 1),
            np.stack([_randint(u[:, 7], 0, bw), _randint(u[:, 8], vh - bh, vh)], 1),
        ],
        axis=1,
    )
    for j in np.flatnonzero(u[:, 0] < step.p):
        w, h = vw[j] - 1, vh[j] - 1
        starts = np.float32([[0, 0], [w, 0], [w, h], [0, h]])
        if np.array_equal(starts, ends[j]) or vw[j] < 2 or vh[j] < 2:  # nothing to move (a 1-pixel side)
            continue
        m = cv2.getPerspectiveTransform(starts, ends[j].astype(np.float32)).astype(np.float64)
        if np.isfinite(m).all() and abs(np.linalg.det(m)) > 1e-9:  # corners in a line: left as it is
            out[j] = m
    return out


def zoom_out(step: RandomZoomOut, u: np.ndarray, vh: np.ndarray, vw: np.ndarray):
    """torchvision's ``RandomZoomOut``: with probability ``p``, a canvas ``r`` times the view (whole
    pixels), the view at a uniform place on it. Returns (matrices, new heights, new widths)."""
    on = u[:, 0] < step.p
    r = step.side_range[0] + u[:, 1] * (step.side_range[1] - step.side_range[0])
    cw, ch = np.floor(vw * r), np.floor(vh * r)
    left, top = np.floor((cw - vw) * u[:, 2]), np.floor((ch - vh) * u[:, 3])
    m = _translation(np.where(on, left, 0.0), np.where(on, top, 0.0))
    return m, np.where(on, ch, vh), np.where(on, cw, vw)


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


def _iou_with(boxes: np.ndarray, crops: np.ndarray) -> np.ndarray:
    """IoU of every box ``[K, 4]`` with every crop ``[T, 4]`` (xyxy): ``[T, K]``."""
    x0 = np.maximum(crops[:, None, 0], boxes[None, :, 0])
    y0 = np.maximum(crops[:, None, 1], boxes[None, :, 1])
    x1 = np.minimum(crops[:, None, 2], boxes[None, :, 2])
    y1 = np.minimum(crops[:, None, 3], boxes[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area_b = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    area_c = (crops[:, 2] - crops[:, 0]) * (crops[:, 3] - crops[:, 1])
    return inter / np.maximum(area_c[:, None] + area_b[None, :] - inter, 1e-12)


def iou_crop(step: RandomIoUCrop, u: np.ndarray, vh: np.ndarray, vw: np.ndarray, boxes: list):
    """torchvision's ``RandomIoUCrop`` per sample, its trials at once: ``boxes[j]`` are sample ``j``'s
    boxes (xyxy) in the current view. Returns (matrices, heights, widths, rects): ``rects [n, 4]``
    the crop (xyxy in the view) whose boxes' centres stay, NaN where the sample is left whole."""
    n, trials, options = len(vh), step.trials, np.asarray(step.options)
    per_round = 1 + 4 * trials
    m, rects = eye(n), np.full((n, 4), np.nan)
    nh, nw = vh.copy(), vw.copy()
    for j in range(n):
        b = np.asarray(boxes[j], dtype=np.float64).reshape(-1, 4)
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        for k in range(step.ROUNDS):
            r = u[j, k * per_round : (k + 1) * per_round]
            option = options[min(int(r[0] * len(options)), len(options) - 1)]
            if option >= 1.0:
                break
            t = r[1:].reshape(trials, 4)
            w = np.floor(vw[j] * (step.min_scale + (step.max_scale - step.min_scale) * t[:, 0]))
            h = np.floor(vh[j] * (step.min_scale + (step.max_scale - step.min_scale) * t[:, 1]))
            with np.errstate(divide="ignore", invalid="ignore"):
                aspect = w / h
            left, top = np.floor((vw[j] - w) * t[:, 2]), np.floor((vh[j] - h) * t[:, 3])
            ok = (aspect >= step.min_aspect_ratio) & (aspect <= step.max_aspect_ratio) & (w > 0) & (h > 0)
            crops = np.stack([left, top, left + w, top + h], axis=1)
            within = (crops[:, None, 0] < cx) & (cx < crops[:, None, 2])
            within &= (crops[:, None, 1] < cy) & (cy < crops[:, None, 3])  # [T, K]
            ious = np.where(within, _iou_with(b, crops), -1.0) if len(b) else np.zeros((trials, 0))
            best = ious.max(axis=1, initial=-1.0)
            ok &= within.any(axis=1) & (best >= option)
            if ok.any():
                i = int(np.argmax(ok))
                rects[j] = crops[i]
                m[j, 0, 2], m[j, 1, 2] = -left[i], -top[i]
                nh[j], nw[j] = h[i], w[i]
                break
    return m, nh, nw, rects


def draw_uniforms(seed: int, epoch: int, idx: np.ndarray, stream: int, step) -> np.ndarray:
    """The numbers one geometric step draws per sample, from its own stream (a horizontal flip, one,
    as the crop+resize path draws it: a list's flips are the same on both paths)."""
    return uniforms(seed, epoch, idx, stream, step.DRAWS)


def shrink_sizes(matrices: np.ndarray, hw: np.ndarray, out_hw: tuple[int, int], limit: float = 0.5):
    """Sizes each pixel source is resized to first (antialiased) so that its warp shrinks no side
    by more than ``1 / limit``: the scale of each source axis is the length its unit step has in the
    output, at the source point the output's centre comes from (the map's derivative there)."""
    try:
        inv = np.linalg.inv(matrices)
    except np.linalg.LinAlgError:  # a degenerate map: warped as it is
        return None
    centre = np.array([out_hw[1] / 2, out_hw[0] / 2, 1.0])
    p = inv @ centre
    p = p[:, :2] / p[:, 2:3]
    m = matrices
    w = m[:, 2, 0] * p[:, 0] + m[:, 2, 1] * p[:, 1] + m[:, 2, 2]
    ox = (m[:, 0, 0] * p[:, 0] + m[:, 0, 1] * p[:, 1] + m[:, 0, 2]) / w
    oy = (m[:, 1, 0] * p[:, 0] + m[:, 1, 1] * p[:, 1] + m[:, 1, 2]) / w
    jx = np.stack([(m[:, 0, 0] - ox * m[:, 2, 0]) / w, (m[:, 1, 0] - oy * m[:, 2, 0]) / w], 1)
    jy = np.stack([(m[:, 0, 1] - ox * m[:, 2, 1]) / w, (m[:, 1, 1] - oy * m[:, 2, 1]) / w], 1)
    fx, fy = np.linalg.norm(jx, axis=1), np.linalg.norm(jy, axis=1)
    h, wd = hw[:, 0].astype(np.float64), hw[:, 1].astype(np.float64)
    ph = np.where(fy < limit, np.maximum(1, np.round(h * fy)), h)
    pw = np.where(fx < limit, np.maximum(1, np.round(wd * fx)), wd)
    if not ((ph < h) | (pw < wd)).any():
        return None
    return np.stack([ph, pw], axis=1).astype(np.int64)


def is_axis_aligned(matrices: np.ndarray) -> bool:
    return bool(
        (np.abs(matrices[:, 0, 1]) < 1e-12).all()
        and (np.abs(matrices[:, 1, 0]) < 1e-12).all()
        and (np.abs(matrices[:, 2, :2]) < 1e-15).all()
    )


def as_boxes(matrices: np.ndarray, out_hw: tuple[int, int]):
    """Axis-aligned maps as whole-pixel crop boxes and flips (``(boxes, hflips, vflips)``), or None
    when some box is not in whole pixels (the general warp takes those)."""
    if not is_axis_aligned(matrices):
        return None
    oh, ow = out_hw
    m = matrices / matrices[:, 2:3, 2:3]
    sx, sy, tx, ty = m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2]
    hflip, vflip = sx < 0, sy < 0
    w, h = ow / np.abs(sx), oh / np.abs(sy)
    left = np.where(hflip, (tx - ow) / -sx, -tx / sx)
    top = np.where(vflip, (ty - oh) / -sy, -ty / sy)
    boxes = np.stack([top, left, h, w], axis=1)
    whole = np.round(boxes)
    if not (np.abs(boxes - whole) < 1e-6).all() or (whole[:, 2:] < 1).any():
        return None
    return whole.astype(np.int64), hflip, vflip
