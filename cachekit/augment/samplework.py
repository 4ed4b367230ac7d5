"""One sample's pixels on the reading threads: what the plan's draws do to each row of a batch.

``SampleWork`` is made by a batch's draws (``Draws.sample_work``) and run by the threads over the
batch, a sample at a time: a mosaic's canvas assembled from its four rows, then the crop+resize
path or one warp into the sample's row, ColorJitter, and the per-sample pixel stage (or, for the
device, the pixel source as it is: a mosaic's canvas). ``feed/`` reads the rows and hands each to
``run``; it never reads the draws' fields.
"""

from __future__ import annotations

import numpy as np
import torch

from ..image.ops import hwc_into_planes
from ..image.scratch import scratch
from .colour import jitter_planes
from .mosaic import render_canvas, render_canvas_pixels
from .warp import flip_sample, warp_hwc, warp_planes
from .warpmatrix import resize_chw, warp_pixels, warp_planes_to_pixels, warp_sample

__all__ = ["SampleWork"]

def _canvas(shape: tuple[int, ...]) -> np.ndarray:
    """This thread's mosaic canvas, contiguous (its memory reused: a 2x canvas is megabytes)."""
    return scratch("samplework.canvas", shape)


def _chw(src: np.ndarray, hwc: bool) -> torch.Tensor:
    t = torch.from_numpy(src)
    return t.permute(2, 0, 1) if hwc else t


class SampleWork:
    """A batch's per-sample pixel work: ``out`` the batch buffer, ``source(r)`` row ``r``'s stored
    image ``(array, channels_last)`` (a mosaic's extra rows), ``stage`` the per-sample pixel stage's
    draws (threads only)."""

    def __init__(self, draws, out, on_threads: bool, heights, widths, source, stage=None) -> None:
        self.draws, self.out, self.on_threads = draws, out, on_threads
        self.heights, self.widths, self.source = heights, widths, source
        self.stage = stage if on_threads else None
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

    def run(self, j: int, src: np.ndarray, hwc: bool) -> None:
        """Sample ``j`` (its stored image ``src``) into its row, then its pixel stage: the stage's first
        steps on the sample's channels-last pixels where the work left it so (``apply_pixels``), the
        rest on the row."""
        pixels = self.pixels(j, src, hwc)
        done = 0
        if pixels is not None:
            if self.stage is not None:
                done = self.stage.apply_pixels(pixels, j)
            hwc_into_planes(pixels, self.out[j])
        if self.stage is not None:
            self.stage.apply_row(self.out[j], j, done)

    def _on_pixels(self, j: int, hwc: bool) -> bool:
        """Whether sample ``j``'s one map runs on channels-last pixels, its result split into the row
        once after the steps that work on pixels: a mosaic's canvas, pixels stored channels-last, a
        stage that starts on pixels (RandomHSV); not before ColorJitter (it works on planes)."""
        if not self.on_threads or self.out.shape[1] not in (3, 4) or self.draws.jitter is not None:
            return False
        starts_on_pixels = self.stage is not None and hasattr(self.stage.parts[0], "apply_pixels")
        return hwc or starts_on_pixels or (self.mosaic is not None and bool(self.mosaic.on[j]))

    def pixels(self, j: int, src: np.ndarray, hwc: bool) -> np.ndarray | None:
        """Sample ``j`` into its row: the crop+resize path, or its one map (a mosaic's canvas first);
        for the device, its pixel source as it is (a mosaic's canvas). Returns the sample's
        channels-last pixels instead when its map left them so (``_on_pixels``), for the caller to
        finish and split into the row (this thread's scratch: valid until its next sample)."""
        draws, out, mosaic = self.draws, self.out, self.mosaic
        shrink = None
        if self.general is not None and self.general.shrink is not None:
            shrink = self.general.shrink[j]
        general = self.general is not None and self.general.fast is None
        on_pixels = general and self._on_pixels(j, hwc)
        if mosaic is not None and mosaic.on[j]:  # the window of its canvas the output sees
            x0, y0, x1, y1 = (int(v) for v in self.general.windows[j])
            sources = [(src, hwc)] + [self.source(r) for r in mosaic.rows[j]]
            if on_pixels and hwc:  # stored channels-last: pixels, all channels of a tile at once
                src, hwc = _canvas((y1 - y0, x1 - x0, out.shape[1])), True
                render_canvas_pixels(sources, mosaic.tiles[j], mosaic.regions[j], mosaic.fill, src, (x0, y0))
            else:
                shape = (out.shape[1], y1 - y0, x1 - x0)
                canvas = _canvas(shape) if self.on_threads else out[j, :, : shape[1], : shape[2]]
                render_canvas([_chw(a, last) for a, last in sources], mosaic.tiles[j], mosaic.regions[j],
                              mosaic.fill, resize_chw, canvas, (x0, y0))  # fmt: skip
                if not self.on_threads:  # the device warps it
                    return None
                src, hwc = canvas, False
        elif not self.on_threads:
            dst = out[j, :, : self.heights[j], : self.widths[j]]
            if hwc:
                hwc_into_planes(src, dst)
            else:
                dst[...] = src
            return None
        if not general:
            pre = draws.pre[j] if draws.pre is not None else None
            warp = warp_hwc if hwc else warp_planes
            warp(src, self.boxes[j], self.flips[j], self.inside[j], out[j], draws.fill, pre)
            if self.vflips is not None and self.vflips[j]:
                flip_sample(out[j], vertical=True)
        elif on_pixels and hwc:
            return warp_pixels(src, self.general.warps[j], out.shape[2:], draws.fill, shrink)
        elif on_pixels:
            return warp_planes_to_pixels(src, self.general.warps[j], out.shape[2:], draws.fill, shrink)
        else:
            warp_sample(src, hwc, self.general.warps[j], out[j], draws.fill, shrink)
        if draws.jitter is not None:
            jitter_planes(out[j], draws.jitter[j], draws.order[j])
        return None
