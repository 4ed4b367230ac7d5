"""Batched on-the-fly augmentation for ``make_loader(augment=[...])``: torchvision-style, per-sample draws.

    from cachekit.transforms import RandomResizedCrop, RandomHorizontalFlip, ColorJitter, CenterCrop, Resize, Letterbox
    from cachekit.transforms import RandomVerticalFlip, RandomRotation, RandomAffine, RandomPerspective
    from cachekit.transforms import RandomZoomOut, RandomIoUCrop, Mosaic

Each sample's random draws come from (seed, epoch, sample index): reproducible, resumable,
independent of thread and worker counts, and new every epoch. Boxes and masks move with the pixels.
See ``cachekit.augment.transforms``, ``cachekit.augment.geometric`` and ``cachekit.augment.mosaic``.
"""

from .augment.geometric import (
    RandomAffine,
    RandomIoUCrop,
    RandomPerspective,
    RandomRotation,
    RandomVerticalFlip,
    RandomZoomOut,
)
from .augment.mosaic import Mosaic
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
    "RandomVerticalFlip",
    "RandomRotation",
    "RandomAffine",
    "RandomPerspective",
    "RandomZoomOut",
    "RandomIoUCrop",
    "Mosaic",
]
