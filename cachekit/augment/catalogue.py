"""Every transform ``make_loader(augment=...)`` takes, in one tuple: the classes ``compile_plan``
accepts, the names a text spec may call, what a schedule function is told apart from."""

from __future__ import annotations

from .autoaugment import AutoAugment, RandAugment, TrivialAugmentWide
from .erasing import RandomErasing
from .geometric import RandomAffine, RandomPerspective, RandomRotation, RandomVerticalFlip
from .mixing import BATCH_TRANSFORMS
from .mosaic import Mosaic
from .photometric import GaussianBlur, RandomGrayscale, RandomHSV
from .transforms import TRANSFORMS
from .userops import USER_OPS
from .zoomcrop import RandomIoUCrop, RandomZoomOut

__all__ = ["CATALOGUE", "STEPS", "GEOMETRIC_STEPS", "PIXEL_TRANSFORMS"]

#: The geometry of one general map per sample (affine, perspective, zoom-out, IoU crop, mosaic).
GEOMETRIC_STEPS = (RandomVerticalFlip, RandomRotation, RandomAffine, RandomPerspective, RandomZoomOut,
                   RandomIoUCrop, Mosaic)  # fmt: skip

#: The per-sample pixel transforms (the plan's stage after the geometry).
PIXEL_TRANSFORMS = (RandAugment, TrivialAugmentWide, AutoAugment, RandomErasing, RandomGrayscale, GaussianBlur,
                    RandomHSV)  # fmt: skip

#: Crops, resizes, flips and colour jitter; the geometry of one map per sample (affine, perspective,
#: zoom-out, IoU crop, mosaic); the per-sample pixel stage; the batch stage (MixUp, CutMix).
CATALOGUE = TRANSFORMS + GEOMETRIC_STEPS + PIXEL_TRANSFORMS + BATCH_TRANSFORMS
#: Everything a list may hold: the catalogue and the user's own ops (``PixelOp``, ``BatchOp``,
#: ``MatrixOp``), which wrap a function and so have no text form of their own.
STEPS = CATALOGUE + USER_OPS
