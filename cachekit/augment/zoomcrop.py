"""SSD's zoom-out and IoU crop (torchvision v2's ``RandomZoomOut`` and ``RandomIoUCrop``), each
with its draw beside it: the zoom-out places the view on a larger canvas, the IoU crop keeps a
part holding some box's centre (it depends on the boxes, which its draw is given).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..image.instances import box_corners
from .checks import check_fill, check_p, is_int, is_real, pair_of_numbers
from .matrices import draw_uniforms, eye, translation
from .protocol import Geometric

__all__ = ["RandomZoomOut", "RandomIoUCrop", "iou_crop", "iou_with"]

#: Largest zoom-out factor taken: beyond, an image is a dot.
MAX_ZOOM_OUT = 16.0


@dataclass(frozen=True)
class RandomZoomOut(Geometric):
    """With probability ``p``, place the image on a canvas ``r`` times its size (``r`` uniform in
    ``side_range``, at a uniform place) filled with ``fill``: SSD's zoom-out, torchvision's. The output
    size then varies: end the list in a fixed size."""

    fill: int = 0
    side_range: tuple[float, float] = (1.0, 4.0)
    p: float = 0.5

    def __post_init__(self) -> None:
        check_fill(self.fill, "RandomZoomOut")
        a, b = pair_of_numbers(self.side_range, "RandomZoomOut side_range")
        if not 1.0 <= a <= b <= MAX_ZOOM_OUT:
            raise ValueError(
                f"RandomZoomOut: side_range must have 1 <= min <= max <= {MAX_ZOOM_OUT:g}, got {self.side_range!r}"
            )
        check_p(self.p, "RandomZoomOut")

    GENERAL = True

    def draw_matrices(self, seed, epoch, idx, stream, vh, vw):
        return _zoom_out(self, draw_uniforms(seed, epoch, idx, stream, self), vh, vw)

    def map_fill(self, fill):
        return self.fill

    def fixed_size(self, size):
        return None

    def size_varies(self, varies: bool) -> bool:
        lo, hi = self.side_range
        return varies or not (hi == 1.0 or self.p == 0.0 or (self.p == 1.0 and lo == hi))


@dataclass(frozen=True)
class RandomIoUCrop(Geometric):
    """SSD's crop (torchvision's ``RandomIoUCrop``): draw an option from ``sampler_options`` (a value
    >= 1 leaves the sample as it is); try ``trials`` crops of ``min_scale``-``max_scale`` of each side
    with an aspect ratio in range, keep the first holding some box's centre with an IoU >= the option
    with one of them; boxes whose centres fall outside the crop are dropped. Needs a cache with
    boxes; the output size varies: end the list in a fixed size. Where torchvision redraws options
    until a crop fits, at most ``ROUNDS`` options are drawn here (then the sample is left whole)."""

    min_scale: float = 0.3
    max_scale: float = 1.0
    min_aspect_ratio: float = 0.5
    max_aspect_ratio: float = 2.0
    sampler_options: tuple[float, ...] | None = None
    trials: int = 40

    ROUNDS = 10
    GENERAL = True
    NEEDS_BOXES = True

    @property
    def DRAWS(self) -> int:  # noqa: N802 -- the protocol's name for it
        return self.ROUNDS * (1 + 4 * self.trials)

    def fixed_size(self, size):
        return None

    def size_varies(self, varies: bool) -> bool:
        return varies or any(v < 1.0 for v in self.options)

    def __post_init__(self) -> None:
        lo, hi = pair_of_numbers((self.min_scale, self.max_scale), "RandomIoUCrop min_scale/max_scale")
        if not 0 < lo <= hi <= 1:
            raise ValueError(f"RandomIoUCrop: need 0 < min_scale <= max_scale <= 1, got {lo}, {hi}")
        lo, hi = pair_of_numbers(
            (self.min_aspect_ratio, self.max_aspect_ratio), "RandomIoUCrop min/max_aspect_ratio"
        )
        if not 0 < lo <= hi <= 100:
            raise ValueError(
                f"RandomIoUCrop: need 0 < min_aspect_ratio <= max_aspect_ratio <= 100, got {lo}, {hi}"
            )
        options = self.options
        if not options or len(options) > 64 or not all(is_real(v) and 0 <= v < math.inf for v in options):
            raise ValueError(
                f"RandomIoUCrop: sampler_options must be 1-64 finite numbers >= 0, got {self.sampler_options!r}"
            )
        if not is_int(self.trials) or not 1 <= self.trials <= 1000:
            raise ValueError(f"RandomIoUCrop: trials must be an integer 1-1000, got {self.trials!r}")
        if self.sampler_options is not None:  # a tuple: the transform stays hashable, like the others
            object.__setattr__(self, "sampler_options", tuple(float(v) for v in options))

    def walk(self, walk, stream: int) -> None:
        """Drawn from each sample's boxes in the view so far (it depends on them: ``walk.boxes``); the
        crop's rect and the map to the view it was drawn in are kept (whose boxes' centres stay)."""
        u = draw_uniforms(walk.seed, walk.epoch, walk.idx, stream, self)
        given = walk.boxes if walk.boxes is not None else [np.zeros((0, 4))] * len(walk.idx)
        in_view = [box_corners(b, np.repeat(walk.m[j : j + 1], len(b), 0)) for j, b in enumerate(given)]
        crop, walk.vh, walk.vw, walk.keep_rects = iou_crop(self, u, walk.vh, walk.vw, in_view)
        walk.keep_maps, walk.m = walk.m.copy(), crop @ walk.m

    @property
    def options(self) -> tuple[float, ...]:
        if self.sampler_options is None:
            return (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 2.0)
        if isinstance(self.sampler_options, (str, bytes)) or not hasattr(self.sampler_options, "__len__"):
            return ()
        return tuple(self.sampler_options)
def _zoom_out(step: RandomZoomOut, u: np.ndarray, vh: np.ndarray, vw: np.ndarray):
    """torchvision's ``RandomZoomOut``: with probability ``p``, a canvas ``r`` times the view (whole
    pixels), the view at a uniform place on it. Returns (matrices, new heights, new widths)."""
    on = u[:, 0] < step.p
    r = step.side_range[0] + u[:, 1] * (step.side_range[1] - step.side_range[0])
    cw, ch = np.floor(vw * r), np.floor(vh * r)
    left, top = np.floor((cw - vw) * u[:, 2]), np.floor((ch - vh) * u[:, 3])
    m = translation(np.where(on, left, 0.0), np.where(on, top, 0.0))
    return m, np.where(on, ch, vh), np.where(on, cw, vw)


def iou_with(boxes: np.ndarray, crops: np.ndarray) -> np.ndarray:
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
            ious = np.where(within, iou_with(b, crops), -1.0) if len(b) else np.zeros((trials, 0))
            best = ious.max(axis=1, initial=-1.0)
            ok &= within.any(axis=1) & (best >= option)
            if ok.any():
                i = int(np.argmax(ok))
                rects[j] = crops[i]
                m[j, 0, 2], m[j, 1, 2] = -left[i], -top[i]
                nh[j], nw[j] = h[i], w[i]
                break
    return m, nh, nw, rects


