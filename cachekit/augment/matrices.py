"""Each geometric transform as one 3x3 map per sample, drawn for a whole batch at once.

The maps of a list (``maps.draw_maps``) are built from these: every step's matrix (each step's
own draw, beside its class), in the list's order, multiplies the map so far, from the sample's pixel source (its stored image, or its mosaic canvas) to the current
view, whose size each step also sets. Coordinates are continuous, pixel ``i`` covering ``[i, i+1)``
(``cachekit.image.geometry``). Crops are part of the one map: they clip nothing on their own, so
what a crop left out can come back into view when a later step (a zoom-out, a rotation) shows
beyond its edges, where torchvision's chain would show ``fill``; boxes and masks follow the same
one map, so they stay on their pixels either way.
"""

from __future__ import annotations

import numpy as np

from .draws import uniforms

__all__ = [
    "eye",
    "crop_matrices",
    "translation",
    "affine_matrices",
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


def translation(tx, ty) -> np.ndarray:
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
    return translation(cx + tx, cy + ty) @ m @ translation(-cx, -cy)


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
