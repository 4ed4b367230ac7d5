"""Batched on-the-fly augmentation: torchvision-style transforms that ``make_loader(augment=[...])`` runs.

The transforms are descriptions, not functions: ``make_loader`` compiles a list of them into a
``Plan`` (``cachekit.augment.plan``) that draws every sample's parameters for a whole batch at once,
from (seed, epoch, sample index) alone, so a run reproduces exactly whatever the thread or worker
count, and a resumed epoch gets the same crops. The geometry of a list (resizes, crops, flips)
folds into one crop box and one resize per sample; the loader runs it in threads over the batch,
or as batched matrix products on the device (``cachekit.augment.warp``); colour jitter follows
(``cachekit.augment.colour``).

Crop boxes are whole source pixels; resizing is torchvision's: bilinear, antialiased when it
shrinks (``torch.nn.functional.interpolate(antialias=True)`` on the CPU, the same filter as one
batched matrix product on a device); a crop larger than its image is padded with zeros, as
torchvision's, and ``Letterbox`` pads with its ``fill``. Boxes and masks of caches that have them
go through each sample's very map (``Draws.affine``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..constants import MAX_SIDE

__all__ = [
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ColorJitter",
    "CenterCrop",
    "Resize",
    "Letterbox",
    "TRANSFORMS",
]


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _size(value, name: str) -> tuple[int, int]:
    pair = (value, value) if _is_int(value) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(_is_int(v) and v > 0 for v in pair):
        raise ValueError(f"{name}: size must be a positive int or (height, width), got {value!r}")
    if max(pair) > MAX_SIDE:
        raise ValueError(
            f"{name}: size {value!r} is past the largest side an image may have, {MAX_SIDE} pixels"
        )
    return int(pair[0]), int(pair[1])


def _pair_of_numbers(value, name: str) -> tuple[float, float]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}: expected (min, max), got {value!r}")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{name}: expected two numbers, got {value!r}")
    a, b = (float(v) for v in value)
    if not (math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"{name}: expected finite numbers, got {value!r}")
    return a, b


def _range(value, name: str, low: float = 0.0) -> tuple[float, float]:
    a, b = _pair_of_numbers(value, name)
    if not low < a <= b:
        raise ValueError(f"{name}: expected {low} < min <= max, got {value!r}")
    return a, b


#: The largest brightness, contrast or saturation factor taken (past a few, every pixel is already at 0 or 255).
MAX_JITTER = 1000.0


def _jitter_range(
    value, name: str, centre: float, low: float, high: float = MAX_JITTER
) -> tuple[float, float]:
    """torchvision's forms: a number ``x`` is ``[centre - x, centre + x]`` (clipped at ``low``), a
    pair is ``(min, max)`` itself; both within ``[low, high]``."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        x = float(value)
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"ColorJitter: {name} must be a finite number >= 0 or (min, max), got {value!r}")
        a, b = max(low, centre - x), centre + x
    else:
        a, b = _pair_of_numbers(value, f"ColorJitter {name}")
        if not low <= a <= b:
            raise ValueError(f"ColorJitter: {name} (min, max) must have {low} <= min <= max, got {value!r}")
    if b > high:
        raise ValueError(f"ColorJitter: {name} must stay within [{low}, {high}], got {value!r}")
    return a, b


@dataclass(frozen=True)
class RandomResizedCrop:
    """A random box of ``scale`` x the area and aspect ``ratio``, resized to ``size`` (torchvision's)."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        _size(self.size, "RandomResizedCrop")
        _range(self.scale, "RandomResizedCrop scale")
        _range(self.ratio, "RandomResizedCrop ratio")


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left-right with probability ``p``."""

    p: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, numbers.Real) or not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip: p must be in [0, 1], got {self.p}")


@dataclass(frozen=True)
class ColorJitter:
    """Brightness, contrast and saturation factors in [max(0, 1 - x), 1 + x], hue shift in [-hue,
    hue] turns (hue <= 0.5); each may also be a ``(min, max)`` pair, as torchvision's.

    Applied in a random order drawn per sample, as torchvision's ``ColorJitter`` does.
    """

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0
    hue: float | tuple[float, float] = 0.0

    def __post_init__(self) -> None:
        for name in ("brightness", "contrast", "saturation"):
            _jitter_range(getattr(self, name), name, 1.0, 0.0)
        _jitter_range(self.hue, "hue", 0.0, -0.5, 0.5)

    def ranges(self) -> list[tuple[float, float]]:
        """(min, max) of the brightness, contrast and saturation factors and of the hue shift."""
        return [
            _jitter_range(getattr(self, n), n, 1.0, 0.0) for n in ("brightness", "contrast", "saturation")
        ] + [_jitter_range(self.hue, "hue", 0.0, -0.5, 0.5)]


@dataclass(frozen=True)
class CenterCrop:
    """The central ``size`` region (padded with zeros where the image is smaller)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        _size(self.size, "CenterCrop")


@dataclass(frozen=True)
class Resize:
    """An int resizes the shorter side to ``size`` keeping the aspect ratio; a pair sets (height, width)."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        _size(self.size, "Resize")


@dataclass(frozen=True)
class Letterbox:
    """YOLO's letterbox: the longer side to ``size`` keeping the aspect ratio, centred on a ``size`` x
    ``size`` canvas of ``fill`` (114, YOLO's grey). Boxes and masks move with the image."""

    size: int
    fill: int = 114

    def __post_init__(self) -> None:
        _size(self.size, "Letterbox")
        if (
            isinstance(self.fill, bool)
            or not isinstance(self.fill, numbers.Integral)
            or not 0 <= self.fill <= 255
        ):
            raise ValueError(f"Letterbox: fill must be an integer 0-255, got {self.fill!r}")


TRANSFORMS = (RandomResizedCrop, RandomHorizontalFlip, ColorJitter, CenterCrop, Resize, Letterbox)
