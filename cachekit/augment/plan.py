"""A compiled list of transforms: every sample's draws for a batch, from (seed, epoch, index) alone.

``compile_plan`` checks a list of ``cachekit.transforms`` and compiles it into a ``Plan``; its
``draw`` walks the list's geometry once (``cachekit.augment.maps.draw_maps``: each sample's 3x3
map, and for a list of crops, resizes and horizontal flips alone the exact crop box per sample,
after a first resize of the whole image when the list starts with ``Resize``), then draws the
colour factors and their order, as ``Draws``, whose ``affine``/``maps`` say where each sample's
points go (boxes and masks follow). A list with a rotation, an affine or perspective map, a
vertical flip, a zoom-out, an IoU crop or a mosaic keeps its 3x3 maps (``Draws.general``).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from ..image.geometry import DEFAULT_MIN_VISIBILITY, Affine
from .catalogue import STEPS
from .devicework import DeviceWork
from .draws import uniforms
from ..image.instances import Instances
from .maps import MapDraws, draw_maps
from .matrices import eye
from .mistakes import not_a_step
from .mixing import BatchMix, compile_mixing
from .mosaic import Mosaic, mosaic_extras, render_mask_canvas
from .protocol import BATCH, COLOUR, GEOMETRY, MOSAIC, PIXEL, Transform
from .samplework import SampleWork
from .stage import Stage, compile_stage
from .transforms import (
    ColorJitter,
)
from .usage import AugmentTypeError, AugmentUsageError
from .userops import BatchOpDraws, compile_batch_ops

__all__ = ["Plan", "Draws", "compile_plan", "check_order", "AugmentUsageError"]

_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its central fallback


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
    ``flips`` and ``pre`` are then unused. Targets follow ``geometry()`` either way (``move_instances``,
    ``mask_map``: the carrier, ``cachekit.image.instances``).
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

    def move_instances(self, instances: Instances, min_visibility: float) -> Instances:
        """A batch's objects (``Instances``, owned by the rows of the batch's read) through their
        samples' maps: boxes clipped, those below ``min_visibility`` dropped with their keypoints and
        labels, each object now owned by the sample it lands in."""
        return self.geometry().move_instances(instances, min_visibility)

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


@dataclass(frozen=True)
class Plan:
    """A compiled list of transforms: its geometry folds into one box per sample, then colour.

    ``min_visibility``: a box keeping less of its area through a sample's crop is dropped.
    ``stage``: the per-sample pixel transforms run on each output row after the geometry and colour
    (``cachekit.augment.stage``); ``mix``: MixUp / CutMix on the batch after them.
    """

    steps: tuple
    min_visibility: float = DEFAULT_MIN_VISIBILITY
    stage: Stage | None = None
    mix: BatchMix | None = None
    #: The whole list as given (``steps`` holds its geometry and colour only): what a loader's state
    #: and a preview write back as text.
    listed: tuple = ()
    #: The user's ``BatchOp`` steps: ``(stream, op, after_mix)``, in list order.
    batch_ops: tuple = ()

    def draw_batch_ops(self, seed: int, epoch: int, indices) -> BatchOpDraws | None:
        """The batch's ``BatchOp`` steps with their generators' keys (the batch's first sample), or None."""
        if not self.batch_ops:
            return None
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        first = int(idx[0]) if len(idx) else 0
        before = tuple((stream, op) for stream, op, after in self.batch_ops if not after)
        after = tuple((stream, op) for stream, op, after in self.batch_ops if after)
        return BatchOpDraws(before, after, seed, epoch, first)

    @property
    def jitter(self) -> ColorJitter | None:
        found = [s for s in self.steps if s.KIND == COLOUR]
        return found[-1] if found else None

    @property
    def geometric(self) -> bool:
        return any(s.KIND in (GEOMETRY, MOSAIC) for s in self.steps)

    @property
    def general(self) -> bool:
        """Whether the list draws one 3x3 map per sample (``cachekit.augment.maps``)."""
        return any(s.GENERAL for s in self.steps)

    @property
    def needs_boxes(self) -> bool:
        """Whether drawing needs each sample's boxes (``RandomIoUCrop``)."""
        return any(s.NEEDS_BOXES for s in self.steps)

    @property
    def mosaic(self) -> Mosaic | None:
        return self.steps[0] if self.steps and self.steps[0].KIND == MOSAIC else None

    def extra_indices(self, seed: int, epoch: int, indices, length: int, pool=None) -> np.ndarray | None:
        """``[n, 3]`` the dataset indices each sample's mosaic reads besides its own (-1: none), or
        None without a mosaic; the batch reads them after its own, in this order, row by row.
        ``pool``: the indices they are drawn from (default: all ``length``)."""
        if self.mosaic is None:
            return None
        return mosaic_extras(
            self.mosaic, seed, epoch, np.asarray(indices, dtype=np.int64).reshape(-1), length, pool
        )

    def fixed_size(self) -> tuple[int, int] | None:
        """The output size whatever the input's, or None when it follows the input."""
        size = None
        for step in self.steps:
            size = step.fixed_size(size)
        return size

    def size_varies(self) -> bool:
        """Whether the output's size may differ from sample to sample even when every input has the
        same size: a ``RandomZoomOut``, ``RandomIoUCrop`` or ``RandomRotation(expand=True)`` that draws
        sizes, with no fixed size after it."""
        varies = False
        for step in self.steps:
            varies = step.size_varies(varies)
        return varies

    def draw(
        self, seed: int, epoch: int, indices, heights, widths, *, extra=None, extra_hw=None, boxes=None
    ) -> Draws:
        """Every sample's parameters; ``heights``/``widths`` are the stored images' sizes; ``extra``
        (``extra_indices``) and ``extra_hw [n, 3, 2]`` the mosaics' other samples and their sizes;
        ``boxes`` each sample's boxes (xyxy) where ``needs_boxes``."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        maps = draw_maps(self.steps, seed, epoch, idx, heights, widths,
                         extra=extra, extra_hw=extra_hw, boxes=boxes)  # fmt: skip
        jitter = order = None
        for k, step in enumerate(self.steps):
            if step.KIND == COLOUR:
                jitter = self._jitter(step, uniforms(seed, epoch, idx, k + 1, 4))
                order = np.argsort(uniforms(seed, epoch, idx, k + 1 + 1000, 4), axis=1).astype(np.int8)
        crops = maps.crops
        if crops is None:  # one general map per sample
            n = len(idx)
            return Draws(np.zeros((n, 4), np.int64), np.zeros(n, dtype=bool), maps.out_size, jitter, order,
                         maps.fill, general=maps)  # fmt: skip
        source = np.stack([np.asarray(heights), np.asarray(widths)], axis=1).reshape(-1, 2).astype(np.int64)
        return Draws(crops.boxes, crops.flips, maps.out_size, jitter, order, maps.fill, crops.pre,
                     source if crops.pre is not None else None)  # fmt: skip

    @staticmethod
    def _jitter(step: ColorJitter, u: np.ndarray) -> np.ndarray:
        """Each sample's factors (and hue shift), uniform in the transform's ranges."""
        return np.stack(
            [lo + u[:, k] * (hi - lo) for k, (lo, hi) in enumerate(step.ranges())], axis=1
        ).astype(np.float32)


# Where each kind of step runs, whatever its place in the list: a mosaic builds the sample, the
# geometry is one map per sample, ColorJitter follows the map, then the per-sample pixel stage in
# list order, then MixUp / CutMix over the batch.
_MOSAIC, _GEOMETRY, _JITTER, _PIXELS, _BATCH = range(5)

#: The stage each kind of step runs in (``protocol``).
_KIND_STAGE = {MOSAIC: _MOSAIC, GEOMETRY: _GEOMETRY, COLOUR: _JITTER, PIXEL: _PIXELS, BATCH: _BATCH}


def _stage_of(step) -> int:
    return _KIND_STAGE[step.KIND]


def _commute(earlier, later) -> bool:
    """Whether ``earlier`` then ``later`` gives exactly what the plan gives running ``later`` first:
    an op whose every output pixel is a function of the same input pixel alone (``PER_PIXEL``:
    ColorJitter's contrast also of the image's mean grey, which a mirror leaves as it is: an integer
    sum on the threads; on the device a float sum in another order, its last bit) listed before a
    mirror (``MIRROR``): the plan runs it after the mirror, and the pixels are the same."""
    return earlier.PER_PIXEL and later.MIRROR


def _first_out_of_order(steps: tuple, stages: list[int]) -> int | None:
    """The first step listed before one that runs ahead of it and does not commute with it (None: none),
    in one pass from the end: the least stage after each step, of all steps and of those no mirror."""
    least = least_unmirrored = len(_KIND_STAGE)
    first = None
    for i in range(len(steps) - 1, -1, -1):
        if (least_unmirrored if steps[i].PER_PIXEL else least) < stages[i]:
            first = i
        least = min(least, stages[i])
        least_unmirrored = least_unmirrored if steps[i].MIRROR else min(least_unmirrored, stages[i])
    return first


def check_order(steps) -> None:
    """Refuse, in one line that says the fix, a list the plan would run in another order than written
    (a step listed before one that runs ahead of it), unless the two commute exactly (``_commute``)."""
    steps = tuple(steps)
    name = [type(s).__name__ for s in steps]
    mosaics = [k for k, s in enumerate(steps) if s.KIND == MOSAIC]
    if len(mosaics) > 1:
        raise AugmentUsageError("augment: give one Mosaic, first (it builds each sample from four)")
    if mosaics and mosaics[0] > 0:
        raise AugmentUsageError(
            "augment: Mosaic must come first (it builds each sample from four before any other step, as "
            f"Ultralytics' Mosaic -> RandomAffine -> ...): list it before {name[0]}"
        )
    stages = [_stage_of(s) for s in steps]
    i = _first_out_of_order(steps, stages)
    if i is None:
        return
    step = steps[i]
    ahead = [k for k in range(i + 1, len(steps)) if stages[k] < stages[i] and not _commute(step, steps[k])]
    if stages[i] == _BATCH:
        raise AugmentUsageError(
            f"augment: {name[i]} mixes whole batches, after every per-sample step has run: "
            f"list it after {name[ahead[-1]]} (at the end)"
        )
    geometry = [k for k in ahead if stages[k] == _GEOMETRY]
    if not geometry:  # a pixel transform listed before ColorJitter, which runs right after the map
        raise AugmentUsageError(
            f"augment: {name[ahead[0]]} runs right after the geometry, before the per-sample pixel "
            f"transforms: list it before {name[i]}"
        )
    raise AugmentUsageError(
        f"augment: {name[i]} runs on each sample after its geometry (crops, resizes, flips, warps): "
        f"list it after {name[geometry[-1]]}"
    )


def _call_of(cls: type) -> str:
    """How an instance of transform class ``cls`` is written: its required arguments named."""
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    missing = dataclasses.MISSING
    required = [f.name for f in fields if f.init and f.default is missing and f.default_factory is missing]
    return f"{cls.__name__}({', '.join(required)})"


def compile_plan(transforms, min_visibility: float = DEFAULT_MIN_VISIBILITY) -> Plan | None:
    """Check a list of cachekit transforms and compile it; None for an empty list."""
    if (
        isinstance(min_visibility, bool)
        or not isinstance(min_visibility, numbers.Real)
        or not (0.0 <= float(min_visibility) <= 1.0)
    ):
        raise ValueError(f"min_visibility must be a number in [0, 1], got {min_visibility!r}")
    if transforms is None:
        return None
    steps = tuple(transforms) if isinstance(transforms, (list, tuple)) else (transforms,)
    for step in steps:
        if isinstance(step, type) and issubclass(step, Transform):
            raise AugmentUsageError(f"augment: {step.__name__} is a class: write {_call_of(step)}")
        if not isinstance(step, Transform):
            if (said := not_a_step(step)) is not None:  # a list in the list, a Compose, None, ...
                raise AugmentTypeError(said)
            names = ", ".join(t.__name__ for t in STEPS)
            given = f"the class {step.__name__}" if isinstance(step, type) else type(step).__name__
            raise TypeError(
                f"augment takes cachekit.transforms ({names}), not {given}; "
                "a function of your own goes in PixelOp(fn), BatchOp(fn) or MatrixOp(fn)"
            )
    if sum(s.KIND == COLOUR for s in steps) > 1:
        raise ValueError("augment: give at most one ColorJitter")
    check_order(steps)
    if sum(s.NEEDS_BOXES for s in steps) > 1:
        raise ValueError("augment: give at most one RandomIoUCrop")
    if any(s.NEEDS_BOXES for s in steps) and steps and steps[0].KIND == MOSAIC:
        raise ValueError("augment: RandomIoUCrop and Mosaic do not go together (SSD's crop or YOLO's mosaic)")
    if not steps:
        return None
    geometry = tuple(s for s in steps if s.KIND in (MOSAIC, GEOMETRY, COLOUR))
    return Plan(
        geometry,
        float(min_visibility),
        stage=compile_stage(steps),
        mix=compile_mixing(steps),
        listed=steps,
        batch_ops=compile_batch_ops(steps),
    )
