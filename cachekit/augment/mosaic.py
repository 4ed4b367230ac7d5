"""Ultralytics' mosaic: four samples around a random centre of a canvas twice the output's side.

``Mosaic(size)`` draws, per sample, whether it is a mosaic (``p``), three more samples from the
whole dataset (indices from (seed, epoch, index): the dataset reads them with the batch), and a
centre ``(xc, yc)`` uniform in ``[size/2, 3*size/2)``. Each of the four images is resized so its
longer side is ``size`` and placed in its quadrant round the centre (top-left: the sample itself,
then top-right, bottom-left, bottom-right), cut at the canvas's edges, on a ``2*size`` canvas of
``fill``: Ultralytics' ``Mosaic._mosaic4``. The sample's view is then the canvas's central
``size x size``, as Ultralytics' ``RandomPerspective`` with its border of ``-size/2`` sees it: a
following ``RandomAffine`` (its scale, shift) brings the rest of the canvas into view. A sample
left single (``p < 1``) is letterboxed to ``size x size``, as Ultralytics does.

The canvas is assembled in the threads (pixels antialiased when shrunk, masks nearest); boxes go
to the canvas through each tile's map, are clipped to it, then follow the sample's one map.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..image.geometry import Affine
from ..image.instances import move_mask
from ..image.ops import hwc_into_planes, planes_as_pixels, planes_into_hwc
from .checks import check_fill, check_p, check_size
from .draws import uniforms
from .matrices import draw_uniforms
from .protocol import MOSAIC, Geometric
from .warpmatrix import resize_hwc

__all__ = [
    "Mosaic",
    "MosaicDraws",
    "mosaic_extras",
    "mosaic_layout",
    "render_canvas",
    "render_canvas_pixels",
    "canvas_window",
    "render_mask_canvas",
]

#: The stream of the extra samples' indices (apart from every step's own, numbered from 1).
EXTRA_STREAM = 90_001


@dataclass(frozen=True)
class Mosaic(Geometric):
    """Four samples in one (Ultralytics' ``mosaic``), ``size x size`` out; must come first in a list."""

    KIND = MOSAIC
    GENERAL = True

    size: int
    p: float = 1.0
    fill: int = 114

    def __post_init__(self) -> None:
        if check_size(self.size, "Mosaic")[0] != check_size(self.size, "Mosaic")[1]:
            raise ValueError(f"Mosaic: size must be one int (a square), got {self.size!r}")
        if 2 * check_size(self.size, "Mosaic")[0] > 8192:
            raise ValueError(f"Mosaic: size {self.size!r} makes a canvas past 8192 pixels; use at most 4096")
        check_p(self.p, "Mosaic")
        check_fill(self.fill, "Mosaic")

    @property
    def side(self) -> int:
        return check_size(self.size, "Mosaic")[0]

    def fixed_size(self, size):
        return check_size(self.size, "Mosaic")

    def size_varies(self, varies: bool) -> bool:
        return False

    def walk(self, walk, stream: int) -> None:
        """The sample built from four (it depends on the batch's extra samples, ``walk.extra``, and
        their sizes): its canvas, the four tiles' maps onto it, each sample's map now from its canvas."""
        n = len(walk.idx)
        u = draw_uniforms(walk.seed, walk.epoch, walk.idx, stream, self)[:, :2]
        extra = walk.extra if walk.extra is not None else np.full((n, 3), -1, np.int64)
        extra_hw = walk.extra_hw if walk.extra_hw is not None else np.zeros((n, 3, 2), np.int64)
        tiles, regions, walk.m, walk.source_hw = mosaic_layout(self, u, extra, walk.hw, extra_hw)
        rows = np.full((n, 3), -1, np.int64)
        on = extra[:, 0] >= 0
        rows[on] = n + np.arange(3 * int(on.sum())).reshape(-1, 3)
        walk.mosaic = MosaicDraws(on, extra, rows, tiles, regions, 2 * self.side, self.fill)
        walk.vh, walk.vw, walk.fill = np.full(n, float(self.side)), np.full(n, float(self.side)), self.fill


@dataclass(frozen=True)
class MosaicDraws:
    """A batch's mosaics: ``on [n]``; ``extra [n, 3]`` the other samples' dataset indices and
    ``rows [n, 3]`` their rows in the batch's read (-1 where single); ``tiles [n, 4, 3, 3]`` each
    image's map onto the canvas; ``regions [n, 4, 4]`` the part of the canvas it covers (x0, y0,
    x1, y1); ``canvas`` its side; ``fill`` its background."""

    on: np.ndarray
    extra: np.ndarray
    rows: np.ndarray
    tiles: np.ndarray
    regions: np.ndarray
    canvas: int
    fill: int


def mosaic_extras(
    step: Mosaic, seed: int, epoch: int, idx: np.ndarray, length: int, pool: np.ndarray | None = None
) -> np.ndarray:
    """``[n, 3]`` the dataset indices each sample's mosaic takes besides its own (-1: left single):
    uniform over the dataset's ``length`` samples, or over ``pool`` (the indices it may take from:
    a cache on object storage offers the samples of the shards its batch reads anyway)."""
    u = uniforms(seed, epoch, idx, EXTRA_STREAM, 4)
    on = u[:, 0] < step.p
    count = length if pool is None else len(pool)
    extra = np.minimum(np.floor(u[:, 1:] * count), max(count - 1, 0)).astype(np.int64)
    if pool is not None and count:
        extra = np.asarray(pool, dtype=np.int64)[extra]
    return np.where(on[:, None] & (count > 0), extra, -1)


def _resized(h: np.ndarray, w: np.ndarray, s: int) -> tuple[np.ndarray, np.ndarray]:
    """Ultralytics' ``load_image``: the longer side to ``s``, sides rounded up (at most ``s``)."""
    r = s / np.maximum(np.maximum(h, w), 1)
    return np.minimum(np.ceil(h * r), s), np.minimum(np.ceil(w * r), s)


def mosaic_layout(step: Mosaic, u: np.ndarray, extra: np.ndarray, hw: np.ndarray, extra_hw: np.ndarray):
    """Each sample's tiles and its map from its pixel source (its canvas, or its own image when
    single) onto the ``size x size`` view. ``u [n, 2]``: the centre's draws; ``hw [n, 2]`` the samples'
    sizes, ``extra_hw [n, 3, 2]`` the extra samples'. Returns (tiles, regions, maps, pixel source
    sizes)."""
    s, n = step.side, len(hw)
    on = extra[:, 0] >= 0
    xc = np.floor(s / 2 + u[:, 0] * s)  # Ultralytics: int(uniform(s/2, 3s/2)), s even
    yc = np.floor(s / 2 + u[:, 1] * s)
    sizes = np.concatenate([hw[:, None, :], extra_hw], axis=1).astype(np.float64)  # [n, 4, 2]
    h, w = _resized(sizes[..., 0], sizes[..., 1], s)
    c = 2 * s
    x1a = np.stack([np.maximum(xc - w[:, 0], 0), xc, np.maximum(xc - w[:, 2], 0), xc], 1)
    y1a = np.stack([np.maximum(yc - h[:, 0], 0), np.maximum(yc - h[:, 1], 0), yc, yc], 1)
    x2a = np.stack([xc, np.minimum(xc + w[:, 1], c), xc, np.minimum(xc + w[:, 3], c)], 1)
    y2a = np.stack([yc, yc, np.minimum(yc + h[:, 2], c), np.minimum(yc + h[:, 3], c)], 1)
    x1b = np.where([True, False, True, False], w - (x2a - x1a), 0)
    y1b = np.where([True, True, False, False], h - (y2a - y1a), 0)
    tiles = np.tile(np.eye(3), (n, 4, 1, 1))
    tiles[..., 0, 0], tiles[..., 1, 1] = w / np.maximum(sizes[..., 1], 1), h / np.maximum(sizes[..., 0], 1)
    tiles[..., 0, 2], tiles[..., 1, 2] = x1a - x1b, y1a - y1b
    regions = np.stack([x1a, y1a, x2a, y2a], axis=2).astype(np.int64)
    maps = np.tile(np.eye(3), (n, 1, 1))
    maps[:, 0, 2] = maps[:, 1, 2] = -s / 2  # the canvas's centre
    # single samples: Ultralytics' letterbox of the resized image (its rounding of the padding)
    top, left = np.round((s - h[:, 0]) / 2 - 0.1), np.round((s - w[:, 0]) / 2 - 0.1)
    single = np.tile(np.eye(3), (n, 1, 1))
    single[:, 0, 0], single[:, 1, 1] = tiles[:, 0, 0, 0], tiles[:, 0, 1, 1]
    single[:, 0, 2], single[:, 1, 2] = left, top
    maps = np.where(on[:, None, None], maps, single)
    source_hw = np.where(on[:, None], np.array([[c, c]]), hw).astype(np.int64)
    return tiles, regions, maps, source_hw


def render_canvas(
    sources: list,
    tiles: np.ndarray,
    regions: np.ndarray,
    fill: int,
    resize,
    out,
    origin: tuple[int, int] = (0, 0),
) -> None:
    """One sample's canvas, or the window of it at ``origin`` (x, y) that ``out [C, h, w]`` (uint8)
    holds: ``sources`` its four images as ``[C, h, w]`` tensors, each resized (``resize(src, (h,
    w))``, antialiased) and pasted into its region; a tile outside the window is not resized."""
    out[...] = fill
    ox, oy = origin
    height, width = out.shape[-2:]
    for src, tile, (x0, y0, x1, y1) in zip(sources, tiles, regions):
        a0, b0, a1, b1 = max(x0, ox), max(y0, oy), min(x1, ox + width), min(y1, oy + height)
        if a1 <= a0 or b1 <= b0:
            continue
        h, w = src.shape[-2:]
        nh, nw = int(round(h * tile[1, 1])), int(round(w * tile[0, 0]))
        padw, padh = int(tile[0, 2]), int(tile[1, 2])
        resized = np.asarray(resize(src, (nh, nw)))
        part = resized[:, b0 - padh : b1 - padh, a0 - padw : a1 - padw]
        dst = out[:, b0 - oy : b1 - oy, a0 - ox : a1 - ox]
        if part.shape[0] > 1 and part.strides[0] < part.strides[2]:  # channels-last (pixels-hwc)
            # cv2.split: numpy's transposing copy is ~6x slower
            hwc_into_planes(part.transpose(1, 2, 0), dst)
        else:
            dst[...] = part


def render_canvas_pixels(
    sources: list, tiles: np.ndarray, regions: np.ndarray, fill: int, out: np.ndarray, origin=(0, 0)
) -> None:
    """``render_canvas`` into channels-last ``out [h, w, C]`` (uint8, C > 1): ``sources`` the four
    images as ``(array, channels_last)`` as stored. Each tile is resized as pixels, all its channels
    in one call (``warpmatrix.resize_hwc``: ``resize_chw``'s values); a tile of planes at its own
    size is interleaved straight into the canvas (``cv2.merge``), one of planes to resize is
    interleaved first; pixels stored channels-last are read as they are, never permuted."""
    out[...] = fill
    ox, oy = origin
    height, width = out.shape[:2]
    for (src, hwc), tile, (x0, y0, x1, y1) in zip(sources, tiles, regions):
        a0, b0, a1, b1 = max(x0, ox), max(y0, oy), min(x1, ox + width), min(y1, oy + height)
        if a1 <= a0 or b1 <= b0:
            continue
        h, w = src.shape[:2] if hwc else src.shape[-2:]
        nh, nw = int(round(h * tile[1, 1])), int(round(w * tile[0, 0]))
        padw, padh = int(tile[0, 2]), int(tile[1, 2])
        dst = out[b0 - oy : b1 - oy, a0 - ox : a1 - ox]
        rows, cols = slice(b0 - padh, b1 - padh), slice(a0 - padw, a1 - padw)
        if not hwc and (nh, nw) == (h, w):
            planes_into_hwc(src[:, rows, cols], dst)
            continue
        pixels = src if hwc else planes_as_pixels(src)
        dst[...] = resize_hwc(pixels, (nh, nw))[rows, cols]


def canvas_window(
    matrix: np.ndarray, out_hw: tuple[int, int], canvas: int, margin: int = 2
) -> tuple[int, ...]:
    """``(x0, y0, x1, y1)``: the part of a canvas that a map onto ``out_hw`` reads (the box round the
    output's corners taken back, ``margin`` pixels more for the bilinear taps), within the canvas."""
    oh, ow = out_hw
    corners = np.linalg.inv(matrix) @ np.array(
        [[0, ow, 0, ow], [0, 0, oh, oh], [1, 1, 1, 1]], dtype=np.float64
    )
    w = corners[2]
    if (w <= 1e-9).any():  # a perspective map folding the view: all of it
        return 0, 0, canvas, canvas
    x, y = corners[0] / w, corners[1] / w
    x0, x1 = (
        int(np.clip(np.floor(x.min()) - margin, 0, canvas)),
        int(np.clip(np.ceil(x.max()) + margin, 0, canvas)),
    )
    y0, y1 = (
        int(np.clip(np.floor(y.min()) - margin, 0, canvas)),
        int(np.clip(np.ceil(y.max()) + margin, 0, canvas)),
    )
    if x1 <= x0 or y1 <= y0:  # the view misses the canvas: one pixel of it (the fill all round)
        return 0, 0, 1, 1
    return x0, y0, x1, y1


def render_mask_canvas(masks: list, tiles: np.ndarray, regions: np.ndarray, canvas: int) -> np.ndarray:
    """One sample's mask canvas (0 where no tile is): each mask resized nearest, as its pixels were,
    by the carrier's mask mover."""
    out = np.zeros((canvas, canvas), dtype=masks[0].dtype if masks else np.uint8)
    for mask, tile, (x0, y0, x1, y1) in zip(masks, tiles, regions):
        if x1 <= x0 or y1 <= y0:
            continue
        h, w = mask.shape
        nh, nw = int(round(h * tile[1, 1])), int(round(w * tile[0, 0]))
        padw, padh = int(tile[0, 2]), int(tile[1, 2])
        resized = move_mask(mask, Affine(nw / w, nh / h), (nh, nw))
        out[y0:y1, x0:x1] = resized[y0 - padh : y1 - padh, x0 - padw : x1 - padw]
    return out


def canvas_side(step: Mosaic) -> int:
    return 2 * step.side
