"""The transform protocol: what the plan asks of each step of an augment list, by its kind.

Every transform (the catalogue's and the user's ``PixelOp``/``BatchOp``/``MatrixOp``) derives from
one of the small bases here, which name its kind and the methods the plan calls; the plan loops
over the steps calling them and never asks which class a step is. What a step does to each target
follows from its kind: a geometric step gives each sample's 3x3 map (pixels, boxes, masks and
keypoints follow it), a pixel step changes pixels alone, a batch step the whole batch.

- ``Geometric`` (``KIND`` "geometry", or "mosaic" for the step that builds a sample from four):
  ``fixed_size(size)``/``size_varies(varies)`` say what output size it leaves; ``GENERAL`` whether it
  needs one general 3x3 map per sample (else the crop+resize path serves, and it carries its exact
  rect: ``carry_rects``); ``draw_matrices`` (where a step draws its own maps) gives each sample's map
  from its view and the view's new size; ``walk`` puts it in the one walk of a list's geometry (a
  mosaic's and an IoU crop's own ``walk`` take the data they depend on: extra samples, boxes).
- ``Colour`` (``KIND`` "colour"): ``ColorJitter``, applied right after the map; it draws its own
  factors and their order (``draw_colour``).
- ``Pixel`` (``KIND`` "pixel"): ``draw_stage(seed, epoch, idx, stream, out_hw)`` gives a batch's
  ``PixelDraws``: ``apply_row(chw, j)`` its OpenCV kernel on a uint8 row (threads),
  ``apply_batch(x)`` its torch kernel on the batch (device), ``matrices(j)`` the maps of any op
  that moves pixels (RandAugment's shears), which boxes and masks follow. Optionally
  ``apply_pixels(hwc, j)``: the same step on the sample's channels-last uint8 ``[H, W, C]`` pixels,
  in place, bit-identical to ``apply_row``. Where a sample's one map leaves channels-last pixels (a
  mosaic's canvas, pixels stored channels-last, a stage whose first step has this kernel), the
  leading steps that have it run there before the one split into the row
  (``StageDraws.apply_pixels``), the rest on the row; a step whose OpenCV calls want interleaved
  channels (RandomHSV's colour conversions) thus skips a merge and a split.
- ``Batch`` (``KIND`` "batch"): MixUp, CutMix and the user's ``BatchOp``, after every per-sample step.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

__all__ = [
    "GEOMETRY",
    "MOSAIC",
    "COLOUR",
    "PIXEL",
    "BATCH",
    "Transform",
    "Geometric",
    "Colour",
    "Pixel",
    "Batch",
    "PixelDraws",
    "PixelsKernel",
]

GEOMETRY, MOSAIC, COLOUR, PIXEL, BATCH = "geometry", "mosaic", "colour", "pixel", "batch"


class Transform:
    """What every step says of itself (class attributes, so a frozen dataclass keeps its fields)."""

    KIND: ClassVar[str] = ""
    #: Its pixels each depend on the same input pixel alone (it commutes with a mirror).
    PER_PIXEL: ClassVar[bool] = False
    #: It moves each pixel to one place (a mirror): per-pixel steps commute with it.
    MIRROR: ClassVar[bool] = False
    #: It draws from each sample's boxes (``RandomIoUCrop``).
    NEEDS_BOXES: ClassVar[bool] = False
    #: It needs one general 3x3 map per sample (rotations, affine and perspective maps, ...).
    GENERAL: ClassVar[bool] = False
    #: It runs on CPU threads only (the user's ``PixelOp``: numpy on each sample).
    HOST_ONLY: ClassVar[bool] = False
    #: How many uniforms it draws per sample for its map (``matrices.draw_uniforms``).
    DRAWS: ClassVar[int] = 4

    def fixed_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The output size after this step whatever the input's (``size``: the one before), or None."""
        return size

    def size_varies(self, varies: bool) -> bool:
        """Whether outputs may differ in size from sample to sample after it (``varies``: before)."""
        return varies


class Geometric(Transform):
    KIND: ClassVar[str] = GEOMETRY

    def draw_matrices(self, seed: int, epoch: int, idx, stream: int, vh, vw):
        """``(maps [n, 3, 3], heights, widths)``: each sample's map from its ``vh`` x ``vw`` view (in
        continuous coordinates) and the view's size after it, drawn from (seed, epoch, index, stream)."""
        raise NotImplementedError

    def map_fill(self, fill):
        """The value of pixels the map uncovers after this step (``fill``: the one before)."""
        return fill

    def walk(self, walk, stream: int) -> None:
        """Its place in the one walk of a list's geometry (``maps.Walk``): its map drawn from the view
        (``draw_matrices``) and composed onto each sample's map, the view's new size, the fill; on the
        crop+resize path its exact rect carried too (``carry_rects``). A step that depends on more
        than the view (a mosaic's extra samples, an IoU crop's boxes) says so in its own ``walk``."""
        view_h, view_w = walk.vh, walk.vw
        own, walk.vh, walk.vw = self.draw_matrices(walk.seed, walk.epoch, walk.idx, stream, walk.vh, walk.vw)
        walk.m, walk.fill = own @ walk.m, self.map_fill(walk.fill)
        if walk.rects is not None:
            self.carry_rects(walk, own, stream, view_h, view_w)

    def carry_rects(self, walk, own, stream: int, view_h, view_w) -> None:
        """On the crop+resize path (no ``GENERAL`` step in the list): carry its exact whole-pixel rect
        (``walk.rects``), the very numbers its map was drawn from. Only steps that are not ``GENERAL``
        are asked."""
        raise NotImplementedError


class Colour(Transform):
    KIND: ClassVar[str] = COLOUR
    PER_PIXEL: ClassVar[bool] = True

    def draw_colour(self, seed: int, epoch: int, idx, stream: int):
        """``(factors float32 [n, 4], order int8 [n, 4])``: each sample's brightness, contrast and
        saturation factors and hue shift, and the order they apply in, from (seed, epoch, index, stream)."""
        raise NotImplementedError


class Pixel(Transform):
    KIND: ClassVar[str] = PIXEL
    #: It needs the cache's mean and std (erasing with noise).
    needs_stats: ClassVar[bool] = False

    def draw_stage(self, seed: int, epoch: int, idx, stream: int, out_hw: tuple[int, int], stats=None):
        """A batch's ``PixelDraws`` for outputs of ``out_hw``."""
        raise NotImplementedError


class Batch(Transform):
    KIND: ClassVar[str] = BATCH


class PixelDraws(Protocol):
    """A pixel step over one batch."""

    def matrices(self, j: int) -> list: ...

    def apply_row(self, chw, j: int) -> None: ...

    def apply_batch(self, x): ...


class PixelsKernel(Protocol):
    """The optional step kernel of ``PixelDraws`` on channels-last pixels (see the module's notes)."""

    def apply_pixels(self, hwc, j: int) -> None: ...
