"""Every transform ``make_loader(augment=...)`` takes, in one tuple: the classes ``compile_plan``
accepts, the names a text spec may call, what a schedule function is told apart from."""

from __future__ import annotations

from .geometric import (
    RandomAffine,
    RandomIoUCrop,
    RandomPerspective,
    RandomRotation,
    RandomVerticalFlip,
    RandomZoomOut,
)
from .mixing import BATCH_TRANSFORMS
from .mosaic import Mosaic
from .photometric import PIXEL_TRANSFORMS
from .transforms import TRANSFORMS
from .userops import USER_OPS

__all__ = ["CATALOGUE", "STEPS", "GEOMETRIC_STEPS"]

#: The geometry of one general map per sample (affine, perspective, zoom-out, IoU crop, mosaic).
GEOMETRIC_STEPS = (RandomVerticalFlip, RandomRotation, RandomAffine, RandomPerspective, RandomZoomOut,
                   RandomIoUCrop, Mosaic)  # fmt: skip

#: Crops, resizes, flips and colour jitter; the geometry of one map per sample (affine, perspective,
#: zoom-out, IoU crop, mosaic); the per-sample pixel stage; the batch stage (MixUp, CutMix).
CATALOGUE = TRANSFORMS + GEOMETRIC_STEPS + PIXEL_TRANSFORMS + BATCH_TRANSFORMS
#: Everything a list may hold: the catalogue and the user's own ops (``PixelOp``, ``BatchOp``,
#: ``MatrixOp``), which wrap a function and so have no text form of their own.
STEPS = CATALOGUE + USER_OPS
