"""Batched on-the-fly augmentation for ``make_loader(augment=[...])``: torchvision-style, per-sample draws.

    from cachekit.transforms import RandomResizedCrop, RandomHorizontalFlip, ColorJitter, CenterCrop, Resize, Letterbox
    from cachekit.transforms import RandAugment, TrivialAugmentWide, AutoAugment, RandomErasing, MixUp, CutMix

Each sample's random draws come from (seed, epoch, sample index): reproducible, resumable,
independent of thread and worker counts, and new every epoch. Boxes and masks move with the pixels.
Per-sample pixel transforms (RandAugment's family, RandomErasing, RandomGrayscale, GaussianBlur,
RandomHSV) run on each output row after the geometry, in list order; MixUp and CutMix mix the
batch last. See ``cachekit.augment.transforms``, ``cachekit.augment.photometric`` and
``cachekit.augment.mixing``.
"""

from .augment.mixing import CutMix, MixUp, MixUpOrCutMix
from .augment.photometric import (
    AutoAugment,
    GaussianBlur,
    RandAugment,
    RandomErasing,
    RandomGrayscale,
    RandomHSV,
    TrivialAugmentWide,
)
from .augment.transforms import (
    CenterCrop,
    ColorJitter,
    Letterbox,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

__all__ = [
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ColorJitter",
    "CenterCrop",
    "Resize",
    "Letterbox",
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
]
