"""One batch's geometry and colour, drawn: ``Draws`` (where each output comes from, how it is coloured).

Made by ``Plan.draw`` (``cachekit.augment.plan``): on the crop+resize path each sample's whole-pixel
crop box and flip, else (``general``) its 3x3 map (``cachekit.augment.maps``); ColorJitter's factors
and order. It says where each sample's pixels, masks and objects go (``sample_work``, ``mask_map``,
``geometry``) and what the device does instead (``device_work``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..image.geometry import Affine
from .devicework import DeviceWork
from .maps import MapDraws
from .matrices import eye
from .mosaic import render_mask_canvas
from .samplework import SampleWork

__all__ = ["Draws"]


@dataclass(frozen=True)
class Draws:
    """One batch's parameters: where each output comes from, and how it is coloured.

    ``boxes``: int64 ``[B, 4]`` (top, left, height, width) in source pixels, possibly reaching
    outside the image (padded with ``fill``); ``flips``: bool ``[B]``; ``jitter``: float32 ``[B, 4]``
    (brightness, contrast, saturation factors, hue shift in turns) or None, applied in the order
    ``order`` (int8 ``[B, 4]``: a permutation of those four per sample). ``pre``: int64 ``[B, 2]``
    sizes each image is first resized to when the list starts with ``Resize`` (the boxes are then in
    the resized image's pixels, as torchvision resizes, then crops), with ``source_hw`` its own.

    ``general``: a list with rotations, affine or perspective maps, vertical flips, zoom-outs, IoU
    crops or mosaics draws one 3x3 map per sample instead (``cachekit.augment.maps``); ``boxes``,
    ``flips`` and ``pre`` are then unused. Targets follow ``geometry()`` either way (its
    ``move_instances``; ``mask_map``: the carrier, ``cachekit.image.instances``).
    """

    boxes: np.ndarray
    flips: np.ndarray
    out_size: tuple[int, int]
    jitter: np.ndarray | None
    order: np.ndarray | None = None
    fill: int = 0
    pre: np.ndarray | None = None
    source_hw: np.ndarray | None = None
    general: MapDraws | None = None

    def geometry(self) -> MapDraws:
        """Each sample's 3x3 map as its targets take it (``augment.instances``): the general maps, or
        on the crop+resize path each sample's ``affine`` as a matrix."""
        if self.general is not None:
            return self.general
        sx, sy, tx, ty = self.maps()
        m = eye(len(sx))
        m[:, 0, 0], m[:, 1, 1], m[:, 0, 2], m[:, 1, 2] = sx, sy, tx, ty
        hw = self.source_hw if self.source_hw is not None else np.zeros((len(sx), 2), np.int64)
        return MapDraws(m, hw, self.out_size)

    def mask_map(self, j: int):
        """Where sample ``j``'s mask pixels go (``image.instances.move_mask``): an ``Affine`` on the
        crop+resize path (its masks are sampled row by row, as its pixels), else its 3x3 map."""
        return self.general.matrices[j] if self.general is not None else self.affine(j)

    def maps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every sample's ``affine`` at once, as arrays ``(sx, sy, tx, ty)``."""
        top, left, h, w = (self.boxes[:, k].astype(np.float64) for k in range(4))
        oh, ow = self.out_size
        sx, sy = ow / w, oh / h
        tx, ty = -left * sx, -top * sy
        if self.pre is not None:  # resized first: source -> pre, then the box
            px = self.pre[:, 1] / self.source_hw[:, 1]
            py = self.pre[:, 0] / self.source_hw[:, 0]
            sx, sy = px * sx, py * sy
        flip = self.flips.astype(bool)
        return np.where(flip, -sx, sx), sy, np.where(flip, ow - tx, tx), ty

    def affine(self, j: int) -> Affine:
        """Where sample ``j``'s points go: resized first (``pre``), its box onto the output, its flip."""
        top, left, h, w = (float(v) for v in self.boxes[j])
        affine = Affine.crop(top, left, h, w, self.out_size)
        if self.pre is not None:
            (ph, pw), (sh, sw) = self.pre[j], self.source_hw[j]
            affine = Affine(pw / sw, ph / sh).then(affine)
        return affine.then(Affine.hflip(self.out_size[1])) if self.flips[j] else affine

    def extra_rows(self, j: int) -> list[int]:
        """The rows of the batch's read that sample ``j``'s mosaic is built from besides its own (none
        without a mosaic)."""
        mosaic = self.general.mosaic if self.general is not None else None
        return mosaic.rows[j].tolist() if mosaic is not None and mosaic.on[j] else []

    def mask_canvas(self, j: int, masks: list) -> np.ndarray:
        """Sample ``j``'s mosaic canvas of class maps from its four rows' ``masks`` (its own first)."""
        mosaic = self.general.mosaic
        return render_mask_canvas(masks, mosaic.tiles[j], mosaic.regions[j], mosaic.canvas)

    @property
    def any_layout(self) -> bool:
        """Whether its rows may be written in any layout (channels-last too): whole-pixel crops,
        resizes and flips do; warps and colour jitter work on planes."""
        return self.jitter is None and (self.general is None or self.general.fast is not None)

    def source_size(self, ragged: bool) -> tuple[int, int] | None:
        """The largest pixel source the device path reads per sample, when its pixel sources are not
        the stored images as read (a mosaic's canvas window) or those differ in size; else None."""
        general = self.general
        if general is None or not (ragged or general.mosaic is not None):
            return None
        return int(general.source_hw[:, 0].max(initial=0)), int(general.source_hw[:, 1].max(initial=0))

    def sample_work(self, out, on_threads: bool, heights, widths, source, stage=None) -> SampleWork:
        """What the reading threads do to each sample's pixels (``augment.samplework``): ``out`` the
        batch buffer, ``source(r)`` row ``r``'s stored image (a mosaic's extra rows), ``stage`` the
        per-sample pixel stage's draws."""
        return SampleWork(self, out, on_threads, heights, widths, source, stage)

    def device_work(self, heights, widths, *, stage=None, batch_ops=None, mix=None) -> DeviceWork:
        """What the device does to this batch read as stored (``heights``/``widths``: the stored
        images' sizes): its geometry, colour, pixel ``stage``, the user's ``batch_ops`` and ``mix``."""
        jitter = order = None
        if self.jitter is not None:
            jitter, order = torch.from_numpy(self.jitter), torch.from_numpy(self.order)
        work = DeviceWork(
            sizes=torch.from_numpy(np.stack([heights, widths], axis=1)),
            out_size=tuple(int(v) for v in self.out_size),
            fill=self.fill,
            jitter=jitter,
            order=order,
            hue=bool((self.jitter[:, 3] != 0).any()) if self.jitter is not None else False,
            stage=stage,
            batch_ops=batch_ops,
            mix=mix,
        )
        general = self.general
        if general is None:  # the crop+resize path
            work.boxes, work.flips = torch.from_numpy(self.boxes), torch.from_numpy(self.flips)
            work.pre = torch.from_numpy(self.pre) if self.pre is not None else None
            return work
        work.sizes = torch.from_numpy(general.source_hw)  # each pixel source's (a mosaic's canvas window)
        if general.fast is not None:
            boxes, hflips, vflips = general.fast
            work.boxes, work.flips, work.vflips = (torch.from_numpy(v) for v in (boxes, hflips, vflips))
        else:
            work.matrices = torch.from_numpy(general.warps)
            work.shrink = torch.from_numpy(general.shrink) if general.shrink is not None else None
        return work

    def inside(self, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """Which boxes lie within their image (the others need padding); of the resized one (``pre``)."""
        if self.pre is not None:
            heights, widths = self.pre[:, 0], self.pre[:, 1]
        t, left, h, w = self.boxes.T
        return (t >= 0) & (left >= 0) & (t + h <= heights) & (left + w <= widths)
