"""A batch's geometry as one 3x3 map per sample: drawn step by step, then applied to pixels, boxes, masks.

``draw_maps`` folds a list's geometric steps (``cachekit.augment.matrices``, ``.mosaic``) into
``MapDraws``: each sample's map from its pixel source (its stored image, or its mosaic canvas) to
the output, the antialiasing pre-resize each source needs, the IoU crop's rule on boxes, and the
mosaic's tiles. When every map of a batch is a whole-pixel crop, resize and flip, ``fast`` holds
them as crop boxes and the batch takes the crop+resize path (``cachekit.augment.warp``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import MAX_SIDE
from ..image.instances import Instances, as_points, box_corners, clip_boxes, points_through
from .matrices import as_boxes, eye, shrink_sizes
from .mosaic import MosaicDraws, canvas_window
from .protocol import COLOUR

__all__ = ["MapDraws", "CropRects", "Walk", "draw_maps"]


@dataclass(frozen=True)
class CropRects:
    """The crop+resize path's whole-pixel rects, carried through the walk beside the maps while every
    step is a crop, resize or horizontal flip (not ``GENERAL``): ``boxes`` int64 ``[n, 4]`` (top,
    left, height, width) in source pixels (of the resized image, ``pre``, when the list starts with
    ``Resize``), ``flips`` bool ``[n]``, ``pre`` int64 ``[n, 2]`` or None. Each crop's rect is drawn
    in the view and composed exactly, rounded once at the end, as torchvision crops a crop: never
    re-derived from the composed float map (two crops would round their .5s otherwise)."""

    boxes: np.ndarray
    flips: np.ndarray
    pre: np.ndarray | None = None


class _Rects:
    """The walk's running rect (``CropRects``) in float source pixels: the view's box ``top, left,
    bh, bw`` and its size ``vh, vw``; ``pre`` the size a leading resize gives."""

    def __init__(self, vh: np.ndarray, vw: np.ndarray) -> None:
        n = len(vh)
        self.top, self.left, self.bh, self.bw = np.zeros(n), np.zeros(n), vh.copy(), vw.copy()
        self.flips = np.zeros(n, dtype=bool)
        self.pre, self.cropped = None, False

    def resize(self, vh: np.ndarray, vw: np.ndarray) -> None:
        """A resize of the view to ``vh`` x ``vw``: before any crop, of the whole image first."""
        if not self.cropped:
            n = len(vh)
            self.pre = np.stack([vh, vw], axis=1).astype(np.int64)
            self.top, self.left, self.bh, self.bw = np.zeros(n), np.zeros(n), vh.copy(), vw.copy()

    def crop(self, crop: np.ndarray, vh: np.ndarray, vw: np.ndarray) -> None:
        """A crop ``[n, 4]`` (top, left, height, width) of the ``vh`` x ``vw`` view (mirrored where
        the view is), composed onto the box in source pixels."""
        ct, cl, ch, cw = crop.T
        cl = np.where(self.flips, vw - cl - cw, cl)  # a crop of the mirrored view, in unmirrored terms
        sy, sx = self.bh / vh, self.bw / vw
        self.top, self.left = self.top + ct * sy, self.left + cl * sx
        self.bh, self.bw = ch * sy, cw * sx
        self.cropped = True

    def done(self) -> CropRects:
        y0, x0 = np.round(self.top), np.round(self.left)
        h = np.maximum(1, np.round(self.top + self.bh) - y0)
        w = np.maximum(1, np.round(self.left + self.bw) - x0)
        return CropRects(np.stack([y0, x0, h, w], axis=1).astype(np.int64), self.flips, self.pre)

class Walk:
    """The one walk of a list's geometry, as it goes (each step's ``walk`` moves it on): ``m [n, 3, 3]``
    each sample's map so far, from its pixel source (``source_hw``: the stored image, or a mosaic's
    canvas) to the current ``vh`` x ``vw`` view; ``fill``; ``rects`` the crop+resize path's exact
    rects while no step is ``GENERAL`` (then None). What some steps depend on besides the view:
    ``extra``/``extra_hw`` the mosaics' extra samples and their sizes, ``boxes`` each sample's boxes
    (xyxy, stored pixels). What some leave: ``mosaic``, an IoU crop's ``keep_rects``/``keep_maps``."""

    def __init__(self, seed: int, epoch: int, idx: np.ndarray, hw: np.ndarray, extra, extra_hw, boxes) -> None:
        self.seed, self.epoch, self.idx, self.hw = seed, epoch, idx, hw
        self.extra, self.extra_hw, self.boxes = extra, extra_hw, boxes
        self.vh, self.vw = hw[:, 0].astype(np.float64), hw[:, 1].astype(np.float64)
        self.m, self.fill, self.source_hw = eye(len(idx)), 0, hw
        self.rects: _Rects | None = _Rects(self.vh, self.vw)
        self.mosaic: MosaicDraws | None = None
        self.keep_rects = self.keep_maps = None


@dataclass(frozen=True)
class MapDraws:
    """``matrices [n, 3, 3]``: each sample's source (its stored image, or its mosaic's canvas) onto
    the output (``out_size``), as its boxes and masks take it; ``warps [n, 3, 3]`` the same from its
    pixel source: a mosaic's window, ``windows [n, 4]`` (x0, y0, x1, y1 on the canvas: the part the
    output sees, all of it when it is pre-resized); ``source_hw [n, 2]`` the pixel sources' sizes;
    ``shrink [n, 2]`` sizes they are resized to first (antialiasing) or None; ``fast`` ``(boxes,
    hflips, vflips)`` when every map of a general list is a whole-pixel crop and flips; ``crops``
    (``CropRects``) a list of crops, resizes and horizontal flips alone, whose batch takes the
    crop+resize path (no ``fast``, ``shrink`` nor ``warps`` then); ``keep_rects [n, 4]`` (NaN:
    none) the IoU crops in the view ``keep_maps`` leads to, whose boxes' centres stay; ``mosaic``
    the batch's mosaics."""

    matrices: np.ndarray
    source_hw: np.ndarray
    out_size: tuple[int, int]
    fill: int = 0
    shrink: np.ndarray | None = None
    fast: tuple | None = None
    keep_rects: np.ndarray | None = None
    keep_maps: np.ndarray | None = None
    mosaic: MosaicDraws | None = None
    warps: np.ndarray | None = None
    windows: np.ndarray | None = None
    crops: CropRects | None = None

    def move_instances(self, objects: Instances, min_visibility: float) -> Instances:
        """A batch's objects (owned by the rows of its read: a mosaic's extra rows after the samples)
        through their samples' maps (``place``, then each sample's map by the carrier): boxes clipped,
        those below ``min_visibility`` dropped with their keypoints and labels, each object now owned
        by the sample it lands in, in the samples' order (a mosaic's objects: its own, then its tiles')."""
        placed, keep, gone = self.place(objects)
        moved = placed.select(keep).through(
            self.matrices[placed.owner[keep]], self.out_size, min_visibility, [g[keep] for g in gone], warn=True
        )
        return moved.select(np.argsort(moved.owner, kind="stable"))

    def place(self, objects: Instances) -> tuple[Instances, np.ndarray, list[np.ndarray]]:
        """What comes before each sample's map: a mosaic's tiles onto its canvas (a box clipped to the
        canvas, a point of a tile's part cut off its region lost) and an IoU crop's rule (the boxes
        whose centres it holds stay). Returns ``(placed, keep [M], gone)``: the objects on their
        samples' sources, each owned by its sample; which stay; per keypoints field, ``[M, K]``
        points lost."""
        owner = np.asarray(objects.owner, dtype=np.int64)
        mosaic = self.mosaic
        extra = mosaic.rows.max(initial=-1) + 1 if mosaic is not None else 0
        sample_of, tile_of = self.rows(max(int(owner.max(initial=-1)) + 1, len(self.matrices), int(extra)))
        j, t = sample_of[owner], tile_of[owner]
        b = np.array(objects.boxes, dtype=np.float64).reshape(-1, 4)
        points = [as_points(p, len(owner)) for _, p, _ in objects.points]
        gone = [np.zeros(p.shape[:2], dtype=bool) for p in points]
        keep = np.ones(len(b), dtype=bool)
        on = mosaic.on[j] if mosaic is not None else np.zeros(len(b), bool)
        if on.any():  # some of these objects are a mosaic's: onto its canvas
            tiles = mosaic.tiles[j[on], t[on]]
            side = (mosaic.canvas, mosaic.canvas)
            placed, inside = clip_boxes(box_corners(b[on], tiles), np.zeros(int(on.sum())), side, 0.0)
            b[on] = placed
            keep[np.flatnonzero(on)[~inside]] = False
            x0, y0, x1, y1 = (mosaic.regions[j[on], t[on], k, None] for k in range(4))
            for p, lost in zip(points, gone):  # a point of a tile's part cut off its region was never drawn
                moved, _ = points_through(p[on], tiles)
                lost[on] = (moved[..., 0] < x0) | (moved[..., 0] > x1) | (moved[..., 1] < y0) | (moved[..., 1] > y1)
                p[on] = moved
        if self.keep_rects is not None and len(b):  # an IoU crop keeps the boxes whose centres it holds
            centre = box_corners(b, self.keep_maps[j])
            cx, cy = (centre[:, 0] + centre[:, 2]) / 2, (centre[:, 1] + centre[:, 3]) / 2
            r = self.keep_rects[j]
            keep &= np.isnan(r[:, 0]) | ((r[:, 0] < cx) & (cx < r[:, 2]) & (r[:, 1] < cy) & (cy < r[:, 3]))
        parts = tuple((name, p, flip_idx) for p, (name, _, flip_idx) in zip(points, objects.points))
        return Instances(b, objects.classes, objects.iscrowd, j, parts), keep, gone

    def rows(self, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """For each row of the batch's read (samples, then mosaics' extra samples): its sample and tile."""
        n = len(self.matrices)
        sample, tile = np.zeros(n_rows, np.int64), np.zeros(n_rows, np.int64)
        sample[:n] = np.arange(n)
        if self.mosaic is not None:
            for k in range(3):
                rows = self.mosaic.rows[:, k]
                has = rows >= 0
                sample[rows[has]], tile[rows[has]] = np.flatnonzero(has), k + 1
        return sample, tile


def draw_maps(
    steps: tuple,
    seed: int,
    epoch: int,
    idx: np.ndarray,
    heights,
    widths,
    *,
    extra: np.ndarray | None = None,
    extra_hw: np.ndarray | None = None,
    boxes: list | None = None,
) -> MapDraws:
    """Every sample's map through ``steps`` (colour steps skipped): the one walk of a list's geometry
    (``Walk``), each step taking its place by its own ``walk`` (its map drawn once; while no step is
    ``GENERAL`` the walk also carries the crop+resize path's exact rects, and no warp is drawn).
    ``extra``/``extra_hw`` the mosaics' extra samples and their sizes; ``boxes`` each sample's boxes
    (xyxy, stored pixels) for ``RandomIoUCrop``: the data the steps that need them take."""
    n = len(idx)
    hw = np.stack([np.asarray(heights), np.asarray(widths)], axis=1).reshape(-1, 2).astype(np.int64)
    walk = Walk(seed, epoch, idx, hw, extra, extra_hw, boxes)
    for k, step in enumerate(steps):
        if step.KIND == COLOUR:
            continue
        if step.GENERAL:
            walk.rects = None  # from here on a general map per sample
        step.walk(walk, k + 1)  # a mosaic and an IoU crop take the data they depend on from the walk
    vh, vw, m, fill, rects, mosaic, source_hw = walk.vh, walk.vw, walk.m, walk.fill, walk.rects, walk.mosaic, walk.source_hw
    keep_rects, keep_maps = walk.keep_rects, walk.keep_maps
    if n and (np.ptp(vh) or np.ptp(vw)):
        raise ValueError(
            "augment gives outputs of different sizes for images of different sizes (or after a "
            "RandomZoomOut, RandomIoUCrop or RandomRotation(expand=True)): end it with "
            "Letterbox, RandomResizedCrop, CenterCrop or Resize((height, width))"
        )
    out = (int(vh[0]), int(vw[0])) if n else (0, 0)
    if max(out) > MAX_SIDE:
        raise ValueError(
            f"augment gives outputs of {out[0]} x {out[1]} pixels, past the largest side an image may have, "
            f"{MAX_SIDE}: end it with Letterbox, RandomResizedCrop, CenterCrop or Resize((height, width))"
        )
    if rects is not None:  # the crop+resize path takes the carried rects; no warp is drawn
        return MapDraws(m, source_hw, out, int(fill), crops=rects.done())
    on = mosaic is not None and bool(mosaic.on.any())
    fast = as_boxes(m, out) if n and not on else None
    shrink = None if fast is not None or not n else shrink_sizes(m, source_hw, out)
    warps, windows = m, None
    if on:
        windows, source_hw, shrink = _windows(m, mosaic, source_hw, shrink, out)
        shift = eye(n)
        shift[:, 0, 2], shift[:, 1, 2] = windows[:, 0], windows[:, 1]
        warps = m @ shift
    return MapDraws(m, source_hw, out, int(fill), shrink, fast, keep_rects, keep_maps, mosaic, warps, windows)


def _windows(m: np.ndarray, mosaic: MosaicDraws, source_hw: np.ndarray, shrink, out: tuple[int, int]):
    """Each mosaic's window of its canvas (the part the output sees; all of it when pre-resized,
    whose filter reaches further), and the pixel sources' sizes and pre-resizes for those windows."""
    n, side = len(m), mosaic.canvas
    windows = np.zeros((n, 4), np.int64)
    windows[:, 2], windows[:, 3] = source_hw[:, 1], source_hw[:, 0]
    source_hw = source_hw.copy()
    shrink = shrink.copy() if shrink is not None else None
    for j in np.flatnonzero(mosaic.on):
        if shrink is not None and (shrink[j] != source_hw[j]).any():
            continue
        windows[j] = canvas_window(m[j], out, side)
        source_hw[j] = windows[j, 3] - windows[j, 1], windows[j, 2] - windows[j, 0]
        if shrink is not None:
            shrink[j] = source_hw[j]
    return windows, source_hw, shrink
