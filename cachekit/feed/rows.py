"""One augmented sample of a batch: what its draws need, its pixels into its row, its target's masks.

A batch whose plan has general maps or a mosaic (``cachekit.augment.maps``) reads more than its own
rows: a mosaic's three extra samples come after the request's own (``read_indices``), and an IoU
crop draws from each sample's boxes, read before the draws (``draw_batch``). ``Rows`` is what a
thread over the batch does per sample: a mosaic's canvas assembled from its four rows, then the
crop+resize path or one warp into the sample's row (or, for the device, the canvas itself), and
its masks (a mosaic's canvas of masks) through the same map.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from ..augment.colour import jitter_planes
from ..augment.mosaic import render_canvas, render_mask_canvas
from ..augment.warp import flip_sample, warp_hwc, warp_planes
from ..augment.warpmatrix import resize_chw, warp_sample
from ..image.ops import hwc_into_planes
from .targets import move_target, sample_target

__all__ = ["read_indices", "draw_batch", "boxes_field", "Rows"]


def _extras(request, dataset) -> np.ndarray | None:
    """``[n, 3]`` the dataset indices of each sample's mosaic besides its own (-1: none), or None.

    Drawn over the whole dataset; from a cache on object storage, over the samples of the shards
    the batch reads anyway (``dataset.mosaic_pool``), as Ultralytics draws them from the images it
    loaded last: uniform extras would pin and download three more shards a sample."""
    plan = getattr(request, "plan", None)
    if plan is None or plan.mosaic is None:
        return None
    idx = np.asarray(request, dtype=np.int64)
    pool = dataset.mosaic_pool(idx) if hasattr(dataset, "mosaic_pool") else None
    return plan.extra_indices(request.seed, request.epoch, idx, len(dataset), pool)


def read_indices(request, dataset) -> list[int]:
    """The indices a request reads of ``dataset``: its own, then (a mosaic) the extra samples each
    sample takes, sample by sample (``assemble`` knows them by position)."""
    extra = _extras(request, dataset)
    if extra is None:
        return list(request)
    return list(request) + extra[extra[:, 0] >= 0].reshape(-1).tolist()


def boxes_field(dataset) -> str:
    """The name of ``dataset``'s boxes field, which ``RandomIoUCrop`` draws from (one line without)."""
    names = [name for name, spec in getattr(dataset, "fields", {}).items() if spec.kind == "boxes"]
    if not names:
        raise ValueError("RandomIoUCrop needs a cache with boxes (cachekit build --annotations ...)")
    return names[0]


def draw_batch(dataset, request, readers, local, heights, widths, values, whole: bool):
    """``(draws, early)``: the batch's draws (None without a plan) and, when an IoU crop drew from
    the boxes of a cache without masks, its targets as read (to be moved after the pixels)."""
    plan, n = request.plan, len(request)
    if not plan:
        return None, None
    early, boxes = None, None
    if plan.needs_boxes:
        name = boxes_field(dataset)
        if values is not None:
            boxes = [np.asarray(v[name]["boxes"]).reshape(-1, 4) for v in values[:n]]
        elif whole:
            early = dataset.batch_targets(read_indices(request, dataset), readers, local, None, 0.0)
            boxes = [t[name].numpy() for t in early]
    extra = _extras(request, dataset)
    extra_hw = None
    if extra is not None:
        extra_hw = np.zeros((n, 3, 2), np.int64)
        extra_hw[extra[:, 0] >= 0] = np.stack([heights[n:], widths[n:]], axis=1).reshape(-1, 3, 2)
    draws = plan.draw(request.seed, request.epoch, np.asarray(request, dtype=np.int64), heights[:n], widths[:n],
                      extra=extra, extra_hw=extra_hw, boxes=boxes)  # fmt: skip
    return draws, early


_scratch = threading.local()


def _canvas(shape: tuple[int, ...]) -> np.ndarray:
    """This thread's mosaic canvas, contiguous (its memory reused: a 2x canvas is megabytes)."""
    size = int(np.prod(shape))
    buffer = getattr(_scratch, "canvas", None)
    if buffer is None or buffer.size < size:
        buffer = _scratch.canvas = np.empty(size, np.uint8)
    return buffer[:size].reshape(shape)


def _chw(src: np.ndarray, hwc: bool) -> torch.Tensor:
    t = torch.from_numpy(src)
    return t.permute(2, 0, 1) if hwc else t


class Rows:
    """A batch's augmented samples, one at a time (each thread takes some): ``out`` the batch buffer,
    ``source(r)`` row ``r``'s stored image ``(array, channels_last)``, ``targets`` the batch's list
    (a mosaic's extra rows get theirs, for their boxes to join the sample's)."""

    def __init__(
        self,
        dataset,
        draws,
        out,
        on_threads: bool,
        heights,
        widths,
        source,
        masks,
        targets,
        indices,
        min_visibility,
    ):
        self.dataset, self.draws, self.out, self.on_threads = dataset, draws, out, on_threads
        self.heights, self.widths, self.source = heights, widths, source
        self.masks, self.targets, self.indices, self.min_visibility = masks, targets, indices, min_visibility
        self.general = draws.general
        self.mosaic = self.general.mosaic if self.general is not None else None
        n = len(out)
        if self.general is None:
            self.boxes, self.flips, self.vflips = draws.boxes, draws.flips, None
            self.inside = draws.inside(heights[:n], widths[:n])
        elif self.general.fast is not None:
            self.boxes, self.flips, self.vflips = self.general.fast
            top, left, h, w = self.boxes.T
            hw = self.general.source_hw
            self.inside = (top >= 0) & (left >= 0) & (top + h <= hw[:, 0]) & (left + w <= hw[:, 1])
        if self.general is None or self.general.fast is not None:  # as Python values, read once a batch
            self.boxes, self.flips = self.boxes.tolist(), self.flips.tolist()
            self.inside = self.inside.tolist()

    def pixels(self, j: int, src: np.ndarray, hwc: bool) -> None:
        """Sample ``j`` into its row: the crop+resize path, or its one map (a mosaic's canvas first);
        for the device, its pixel source as it is (a mosaic's canvas)."""
        draws, out, mosaic = self.draws, self.out, self.mosaic
        shrink = None
        if self.general is not None and self.general.shrink is not None:
            shrink = self.general.shrink[j]
        if mosaic is not None and mosaic.on[j]:  # the window of its canvas the output sees
            x0, y0, x1, y1 = (int(v) for v in self.general.windows[j])
            shape = (out.shape[1], y1 - y0, x1 - x0)
            canvas = _canvas(shape) if self.on_threads else out[j, :, : shape[1], : shape[2]]
            sources = [_chw(src, hwc)] + [_chw(*self.source(r)) for r in mosaic.rows[j]]
            render_canvas(
                sources, mosaic.tiles[j], mosaic.regions[j], mosaic.fill, resize_chw, canvas, (x0, y0)
            )
            if not self.on_threads:  # the device warps it
                return
            src, hwc = canvas, False
        elif not self.on_threads:
            dst = out[j, :, : self.heights[j], : self.widths[j]]
            if hwc:
                hwc_into_planes(src, dst)
            else:
                dst[...] = src
            return
        if self.general is None or self.general.fast is not None:
            pre = draws.pre[j] if draws.pre is not None else None
            warp = warp_hwc if hwc else warp_planes
            warp(src, self.boxes[j], self.flips[j], self.inside[j], out[j], draws.fill, pre)
            if self.vflips is not None and self.vflips[j]:
                flip_sample(out[j], vertical=True)
        else:
            warp_sample(src, hwc, self.general.warps[j], out[j], draws.fill, shrink)
        if draws.jitter is not None:
            jitter_planes(out[j], draws.jitter[j], draws.order[j])

    def _target(self, values: list, r: int) -> dict:
        hw = (int(self.heights[r]), int(self.widths[r]))
        return sample_target(self.dataset.fields, values[r], f"sample {self.indices[r]}", hw)

    def target(self, j: int, values: list) -> dict:
        """Sample ``j``'s target, its masks moved (a mosaic's from its four rows' masks); its boxes
        move after, the whole batch's at once."""
        draws, mosaic, fields = self.draws, self.mosaic, self.dataset.fields
        target = self._target(values, j)
        if not self.masks:
            return target
        rows = {name: buffer[j].numpy() for name, buffer in self.masks.items()}
        if mosaic is not None and mosaic.on[j]:
            tiles = [target]
            for r in mosaic.rows[j].tolist():
                tiles.append(self._target(values, r))
                self.targets[r] = tiles[-1]  # its boxes join the batch's, into this sample
            for name in rows:
                masks = [t[name] for t in tiles]
                target[name] = render_mask_canvas(masks, mosaic.tiles[j], mosaic.regions[j], mosaic.canvas)
        return move_target(
            fields, target, draws.mask_map(j), draws.out_size, self.min_visibility, rows, False
        )
