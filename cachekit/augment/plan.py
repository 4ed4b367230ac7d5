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

from ..image.geometry import DEFAULT_MIN_VISIBILITY
from .batchdraws import Draws
from .batchwork import BatchWork
from .catalogue import STEPS
from .maps import draw_maps
from .mistakes import not_a_step
from .mixing import BatchMix, compile_mixing
from .mosaic import Mosaic, mosaic_extras
from .protocol import BATCH, COLOUR, GEOMETRY, MOSAIC, PIXEL, Transform
from .stage import Stage, compile_stage
from .transforms import (
    ColorJitter,
)
from .usage import AugmentTypeError, AugmentUsageError
from .userops import BatchOpDraws, compile_batch_ops

__all__ = ["Plan", "Draws", "compile_plan", "check_order", "AugmentUsageError"]

_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 boxes before its central fallback


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
                jitter, order = step.draw_colour(seed, epoch, idx, k + 1)
        crops = maps.crops
        if crops is None:  # one general map per sample
            n = len(idx)
            return Draws(np.zeros((n, 4), np.int64), np.zeros(n, dtype=bool), maps.out_size, jitter, order,
                         maps.fill, general=maps)  # fmt: skip
        source = np.stack([np.asarray(heights), np.asarray(widths)], axis=1).reshape(-1, 2).astype(np.int64)
        return Draws(crops.boxes, crops.flips, maps.out_size, jitter, order, maps.fill, crops.pre,
                     source if crops.pre is not None else None)  # fmt: skip

    def draw_batch(
        self,
        seed: int,
        epoch: int,
        indices,
        heights,
        widths,
        *,
        extra=None,
        extra_hw=None,
        boxes=None,
        on_device: bool = False,
        channels_last: bool = False,
        stats=None,
        detection: bool = False,
    ) -> BatchWork:
        """Everything one batch takes, drawn once (``draw``, the pixel stage, the user's batch ops,
        MixUp / CutMix), as the object that runs it (``augment.batchwork``). ``stats()``: the cache's
        (mean, std), asked only when a step needs them (RandomErasing's noise); ``detection``: the
        cache has boxes (MixUp keeps both samples' then)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        draws = self.draw(seed, epoch, idx, heights, widths, extra=extra, extra_hw=extra_hw, boxes=boxes)
        stage = None
        if self.stage is not None:
            stage = self.stage.draw(seed, epoch, idx, draws.out_size, stats() if self.stage.needs_stats else None)
        mix = self.mix.draw(seed, epoch, idx, draws.out_size, detection) if self.mix is not None else None
        ops = self.draw_batch_ops(seed, epoch, idx)
        return BatchWork(draws, stage, ops, mix, on_device, channels_last, self.min_visibility)


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
