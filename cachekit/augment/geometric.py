"""Geometric transforms beyond crop, resize and flip: vertical flips, rotations, affine and
perspective maps, as descriptions (torchvision v2's names, parameters and meanings), each with its
draw beside it.

Each is one 3x3 map per sample, drawn from (seed, epoch, index) and composed with the rest of a
list's geometry into the one map that moves the sample's pixels, boxes and masks
(``cachekit.augment.maps``, ``cachekit.augment.warpmatrix``). Angles are in degrees; fills are
0-255 grey levels. Zoom-out and SSD's IoU crop are in ``cachekit.augment.zoomcrop``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np

from .checks import check_fill, check_p, degrees_range, is_real, pair_of_numbers, shear_ranges
from .matrices import affine_matrices, draw_uniforms, eye, translation
from .protocol import Geometric

__all__ = ["RandomVerticalFlip", "RandomRotation", "RandomAffine", "RandomPerspective"]

#: Largest scale taken: beyond, an image is a dot or a line.
MAX_SCALE = 16.0
#: Largest perspective term (Ultralytics' ``perspective``; 0.0005 is a strong one).
MAX_PERSPECTIVE = (
    0.001  # Ultralytics' documented range (0-0.001); past it a map folds an image through its horizon
)


@dataclass(frozen=True)
class RandomVerticalFlip(Geometric):
    """Mirror top-bottom with probability ``p``."""

    MIRROR = True
    GENERAL = True
    DRAWS = 1

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        return _vertical_flip(self, draw_uniforms(seed, epoch, idx, stream, self), vh), vh, vw

    p: float = 0.5

    def __post_init__(self) -> None:
        check_p(self.p, "RandomVerticalFlip")


@dataclass(frozen=True)
class RandomRotation(Geometric):
    """Rotate by an angle uniform in ``degrees`` (a number ``d``: (-d, d)), counter-clockwise, about
    ``center`` (x, y in pixels; default the image's centre), as torchvision's. ``expand=True`` grows
    the output to hold the whole turned image (its size then varies: end the list in a fixed size).
    Corners the image leaves take ``fill``."""

    degrees: float | tuple[float, float]
    expand: bool = False
    center: tuple[float, float] | None = None
    fill: int = 0

    def __post_init__(self) -> None:
        degrees_range(self.degrees, "RandomRotation")
        if not isinstance(self.expand, bool):
            raise ValueError(f"RandomRotation: expand must be True or False, got {self.expand!r}")
        if self.center is not None:
            pair_of_numbers(self.center, "RandomRotation center")
        check_fill(self.fill, "RandomRotation")

    GENERAL = True
    DRAWS = 1

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        return _rotation(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw)

    def map_fill(self, fill):
        return self.fill

    def fixed_size(self, size):
        return None if self.expand else size

    def size_varies(self, varies: bool) -> bool:
        if not self.expand:
            return varies
        lo, hi = degrees_range(self.degrees, "RandomRotation")
        return varies or lo != hi


@dataclass(frozen=True)
class RandomAffine(Geometric):
    """torchvision's random affine map about the image's centre: an angle uniform in ``degrees``
    (clockwise, as torchvision's ``affine``), a shift of up to ``translate`` = (fx, fy) of the width
    and height (whole pixels), a scale uniform in ``scale`` = (min, max), and ``shear`` (degrees: a
    number ``s`` shears x in (-s, s), a pair x in (min, max), four values x and y).

    ``perspective`` (Ultralytics' term, default 0): the map's two perspective terms uniform in
    (-perspective, perspective) around the centre, as Ultralytics' ``RandomPerspective`` draws them
    (0.0005 is a strong one). With ``degrees``, ``translate``, ``scale`` and ``shear`` this covers
    Ultralytics' augmentation (its ``scale=0.5`` is ``scale=(0.5, 1.5)`` here; its ``translate=0.1``
    is ``translate=(0.1, 0.1)``). After ``Mosaic`` it acts on the mosaic's centre as Ultralytics'
    does with its border of -size/2.
    """

    degrees: float | tuple[float, float] = 0.0
    translate: tuple[float, float] | None = None
    scale: tuple[float, float] | None = None
    shear: float | tuple[float, ...] | None = None
    fill: int = 0
    perspective: float = 0.0
    _shear: tuple | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        degrees_range(self.degrees, "RandomAffine")
        if self.translate is not None:
            a, b = pair_of_numbers(self.translate, "RandomAffine translate")
            if not (0 <= a <= 1 and 0 <= b <= 1):
                raise ValueError(
                    f"RandomAffine: translate fractions must be in [0, 1], got {self.translate!r}"
                )
        if self.scale is not None:
            a, b = pair_of_numbers(self.scale, "RandomAffine scale")
            if not 0 < a <= b <= MAX_SCALE:
                raise ValueError(
                    f"RandomAffine: scale must be (min, max) with 0 < min <= max <= {MAX_SCALE:g}, "
                    f"got {self.scale!r}"
                )
        object.__setattr__(self, "_shear", shear_ranges(self.shear, "RandomAffine"))
        check_fill(self.fill, "RandomAffine")
        if not is_real(self.perspective) or not 0 <= float(self.perspective) <= MAX_PERSPECTIVE:
            raise ValueError(
                f"RandomAffine: perspective must be a number in [0, {MAX_PERSPECTIVE}], got {self.perspective!r}"
            )

    GENERAL = True
    DRAWS = 8

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        return _affine(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw), vh, vw

    def map_fill(self, fill):
        return self.fill

    @property
    def shear_ranges(self) -> tuple[float, float, float, float]:
        return self._shear or (0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class RandomPerspective(Geometric):
    """With probability ``p``, move each corner inwards by up to ``distortion_scale`` of half the side
    (torchvision's draw) and warp the image onto them; uncovered pixels take ``fill``."""

    distortion_scale: float = 0.5
    p: float = 0.5
    fill: int = 0

    def __post_init__(self) -> None:
        if not is_real(self.distortion_scale) or not 0 <= float(self.distortion_scale) <= 1:
            raise ValueError(
                f"RandomPerspective: distortion_scale must be in [0, 1], got {self.distortion_scale!r}"
            )
        check_p(self.p, "RandomPerspective")
        check_fill(self.fill, "RandomPerspective")

    GENERAL = True
    DRAWS = 9

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        return _perspective(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw), vh, vw

    def map_fill(self, fill):
        return self.fill


def _vertical_flip(step: RandomVerticalFlip, u: np.ndarray, vh: np.ndarray) -> np.ndarray:
    flip = u[:, 0] < step.p
    m = eye(len(vh))
    m[flip, 1, 1], m[flip, 1, 2] = -1.0, vh[flip]
    return m


def _rotation(step: RandomRotation, u: np.ndarray, vh: np.ndarray, vw: np.ndarray):
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
    shift = translation(nw / 2 - vw / 2, nh / 2 - vh / 2)
    return shift @ m, nh, nw


def _affine(step: RandomAffine, u: np.ndarray, vh: np.ndarray, vw: np.ndarray) -> np.ndarray:
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
        m = m @ translation(cx, cy) @ p @ translation(-cx, -cy)
    return m


def _randint(u: np.ndarray, low, high) -> np.ndarray:
    """``torch.randint(low, high)`` from uniforms: an integer in ``[low, high)``."""
    return low + np.floor(u * (high - low))


def _perspective(step: RandomPerspective, u: np.ndarray, vh: np.ndarray, vw: np.ndarray) -> np.ndarray:
    """torchvision's ``RandomPerspective``: each corner moved inwards by up to ``distortion_scale`` of
    half the side (whole pixels), applied with probability ``p``; the homography taking the
    corners ``(0, 0), (w-1, 0), (w-1, h-1), (0, h-1)`` to the moved ones."""
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


