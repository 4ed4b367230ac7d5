"""Batched on-the-fly augmentation for ``make_loader(augment=[...])``: torchvision-style, per-sample draws.

    from cachekit.transforms import RandomResizedCrop, RandomHorizontalFlip, ColorJitter, CenterCrop, Resize, Letterbox
    from cachekit.transforms import RandomVerticalFlip, RandomRotation, RandomAffine, RandomPerspective
    from cachekit.transforms import RandomZoomOut, RandomIoUCrop, Mosaic
    from cachekit.transforms import RandAugment, TrivialAugmentWide, AutoAugment, RandomErasing, MixUp, CutMix
    from cachekit.transforms import PixelOp, BatchOp, MatrixOp  # your own functions, on the fast path

Each sample's random draws come from (seed, epoch, sample index): reproducible, resumable,
independent of thread and worker counts, and new every epoch. Boxes and masks move with the pixels.
The geometry of a list (crops, resizes, flips, affine, perspective, mosaic) is one map per sample;
per-sample pixel transforms (RandAugment's family, RandomErasing, RandomGrayscale, GaussianBlur,
RandomHSV) run on each output row after it, in list order; MixUp and CutMix mix the batch last. See
``cachekit.augment.transforms``, ``geometric``, ``zoomcrop``, ``mosaic``, ``photometric``,
``autoaugment``, ``erasing`` and ``mixing``.
"""

from .augment.autoaugment import AutoAugment, RandAugment, TrivialAugmentWide
from .augment.erasing import RandomErasing
from .augment.geometric import RandomAffine, RandomPerspective, RandomRotation, RandomVerticalFlip
from .augment.mixing import CutMix, MixUp, MixUpOrCutMix
from .augment.mosaic import Mosaic
from .augment.photometric import GaussianBlur, RandomGrayscale, RandomHSV
from .augment.transforms import (
    CenterCrop,
    ColorJitter,
    Letterbox,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from .augment.userops import BatchOp, MatrixOp, PixelOp
from .augment.zoomcrop import RandomIoUCrop, RandomZoomOut

__all__ = [
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ColorJitter",
    "CenterCrop",
    "Resize",
    "Letterbox",
    "RandomVerticalFlip",
    "RandomRotation",
    "RandomAffine",
    "RandomPerspective",
    "RandomZoomOut",
    "RandomIoUCrop",
    "Mosaic",
    "RandAugment",
    "TrivialAugmentWide",
    "AutoAugment",
    "RandomErasing",
    "RandomGrayscale",
    "GaussianBlur",
    "RandomHSV",
    "MixUp",
    "CutMix",
    "MixUpOrCutMix",
    "PixelOp",
    "BatchOp",
    "MatrixOp",
]
