"""Batched on-the-fly augmentation for ``make_loader(augment=[...])``: torchvision-style, per-sample draws.

    from cachekit.transforms import RandomResizedCrop, RandomHorizontalFlip, ColorJitter, CenterCrop, Resize, Letterbox

Each sample's random draws come from (seed, epoch, sample index): reproducible, resumable,
independent of thread and worker counts, and new every epoch. Boxes and masks move with the pixels.
See ``cachekit.augment.transforms``.
"""

from .augment.transforms import (
    CenterCrop,
    ColorJitter,
    Letterbox,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

__all__ = ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter", "CenterCrop", "Resize", "Letterbox"]
