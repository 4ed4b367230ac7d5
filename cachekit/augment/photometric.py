"""Per-sample pixel transforms after the geometry: RandAugment's family, erasing, grayscale, blur, HSV gains.

Descriptions only, as ``cachekit.augment.transforms``: torchvision v2's names, parameters and
meanings (Ultralytics' for ``RandomHSV``), every bound checked here in one line. ``make_loader``
compiles them into the plan's per-sample stage (``cachekit.augment.stage``), which runs each
output row through them in list order, after the crop, resize, flip and ``ColorJitter``: in the
threads over the batch on the CPU, or batched in torch on the device. Every draw comes from
(seed, epoch, sample index), each transform its own stream.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from . import pixelbatch, pixelkernels
from .draws import uniforms
from .protocol import Pixel
from .transforms import _is_int, _pair_of_numbers

__all__ = [
    "RandAugment",
    "TrivialAugmentWide",
    "AutoAugment",
    "RandomErasing",
    "RandomGrayscale",
    "GaussianBlur",
    "RandomHSV",
    "PIXEL_TRANSFORMS",
    "check_fill",
    "check_p",
]

#: The most operations RandAugment may chain per sample (torchvision sets no bound; 2-4 is usual).
MAX_OPS = 16
#: The most magnitude bins (torchvision's default is 31).
MAX_BINS = 1024
#: The widest Gaussian kernel, in pixels.
MAX_KERNEL = 255
#: AutoAugment's policies, by torchvision's ``AutoAugmentPolicy`` values.
POLICIES = ("imagenet", "cifar10", "svhn")


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_p(p, name: str) -> float:
    """A probability: a finite number in [0, 1]."""
    if not _is_real(p) or not 0.0 <= float(p) <= 1.0:  # NaN fails both comparisons
        raise ValueError(f"{name}: p must be a number in [0, 1], got {p!r}")
    return float(p)


def check_fill(fill, name: str) -> tuple[int, ...]:
    """A fill: one pixel value 0-255 for every channel, or three, one per RGB channel (None is 0, as
    torchvision); a one-channel sample takes the first."""
    if fill is None:
        return (0,)
    values = tuple(fill) if isinstance(fill, (tuple, list)) else (fill,)
    if len(values) not in (1, 3) or not all(_is_real(v) and 0 <= v <= 255 for v in values):
        raise ValueError(f"{name}: fill must be a pixel value 0-255 or one per RGB channel, got {fill!r}")
    return tuple(int(round(float(v))) for v in values)


def _count(value, name: str, low: int, high: int) -> int:
    if not _is_int(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RandAugment(Pixel):
    """``num_ops`` operations drawn uniformly from torchvision's 14 (Identity, ShearX/Y, TranslateX/Y,
    Rotate, Brightness, Color, Contrast, Sharpness, Posterize, Solarize, AutoContrast, Equalize), each
    at bin ``magnitude`` of ``num_magnitude_bins``, signed ones negated half the time. Shears,
    translations and rotations move boxes and masks too; ``fill`` is what they uncover."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    fill: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        _count(self.num_ops, "RandAugment: num_ops", 0, MAX_OPS)
        bins = _count(self.num_magnitude_bins, "RandAugment: num_magnitude_bins", 2, MAX_BINS)
        _count(self.magnitude, "RandAugment: magnitude", 0, bins - 1)
        check_fill(self.fill, "RandAugment")

    SPACE = "rand"

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        from .autoaugment import draw_ops  # its tables import this module

        return draw_ops(self, seed, epoch, idx, stream, out_hw)


@dataclass(frozen=True)
class TrivialAugmentWide(Pixel):
    """One operation per sample from torchvision's wide table, at a magnitude bin drawn uniformly."""

    num_magnitude_bins: int = 31
    fill: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        _count(self.num_magnitude_bins, "TrivialAugmentWide: num_magnitude_bins", 2, MAX_BINS)
        check_fill(self.fill, "TrivialAugmentWide")

    SPACE = "wide"
    draw_stage = RandAugment.draw_stage


@dataclass(frozen=True)
class AutoAugment(Pixel):
    """One of the ``policy``'s 25 learned sub-policies per sample (``"imagenet"``, ``"cifar10"`` or
    ``"svhn"``): two operations, each applied with its own probability at its own magnitude."""

    policy: str = "imagenet"
    fill: int | tuple[int, ...] = 0

    def __post_init__(self) -> None:
        # kept as its lower-case name: an enum member (torchvision's) writes back as text, so a
        # loader's state keeps it for a resumed epoch
        object.__setattr__(self, "policy", self.policy_name())
        check_fill(self.fill, "AutoAugment")

    SPACE = "auto"
    draw_stage = RandAugment.draw_stage

    def policy_name(self) -> str:
        """The policy as a lower-case name (torchvision's ``AutoAugmentPolicy`` members work too)."""
        name = getattr(self.policy, "value", self.policy)
        if not isinstance(name, str) or name.lower() not in POLICIES:
            raise ValueError(f"AutoAugment: policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        return name.lower()


@dataclass(frozen=True)
class RandomErasing(Pixel):
    """With probability ``p``, a box of ``scale`` x the area and aspect ``ratio`` (height / width) set
    to ``value``: a pixel value, one per channel, or ``"random"`` (per-pixel normal noise). Ten
    attempts at a box that fits, then nothing, as torchvision.

    Values are pixel levels (the rows are uint8 here): 0 is black. ``"random"`` draws each pixel
    ``z ~ N(0, 1)`` in the space ``normalize=True`` gives, i.e. ``255 * (mean + std * z)`` with the
    cache's statistics, as torchvision's erasing after ``Normalize`` (DeiT's place for it) does."""

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float | tuple[float, ...] | str = 0

    def __post_init__(self) -> None:
        check_p(self.p, "RandomErasing")
        lo, hi = _pair_of_numbers(self.scale, "RandomErasing scale")
        if not 0.0 <= lo <= hi <= 1.0:
            raise ValueError(
                f"RandomErasing: scale must be (min, max) with 0 <= min <= max <= 1, got {self.scale!r}"
            )
        lo, hi = _pair_of_numbers(self.ratio, "RandomErasing ratio")
        if not 0.0 < lo <= hi:
            raise ValueError(
                f"RandomErasing: ratio must be (min, max) with 0 < min <= max, got {self.ratio!r}"
            )
        self.values()

    def values(self) -> tuple[int, ...] | None:
        """The erasing value per channel (one for all), or None for ``"random"``."""
        if isinstance(self.value, str):
            if self.value != "random":
                raise ValueError(
                    f"RandomErasing: value must be a number, one per channel, or 'random', got {self.value!r}"
                )
            return None
        return check_fill(self.value, "RandomErasing value")

    @property
    def needs_stats(self) -> bool:
        """Noise (``value="random"``) is drawn in the space ``normalize=True`` gives: the cache's statistics."""
        return self.values() is None

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        from .erasing import draw_erasing  # its draws import this module

        return draw_erasing(self, seed, epoch, idx, stream, out_hw, stats)


@dataclass(frozen=True)
class RandomGrayscale(Pixel):
    """With probability ``p``, every channel becomes the sample's gray (torchvision's weights)."""

    p: float = 0.1
    PER_PIXEL = True

    def __post_init__(self) -> None:
        check_p(self.p, "RandomGrayscale")

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        return _Gray(uniforms(seed, epoch, idx, stream, 1)[:, 0] < self.p)


@dataclass(frozen=True)
class GaussianBlur(Pixel):
    """A Gaussian blur with an odd ``kernel_size`` (an int, or (width, height) as torchvision) and a
    ``sigma`` drawn per sample uniformly in ``sigma`` (a number is (sigma, sigma)); borders reflect."""

    kernel_size: int | tuple[int, int]
    sigma: float | tuple[float, float] = (0.1, 2.0)

    def __post_init__(self) -> None:
        self.sizes()
        self.sigmas()

    def sizes(self) -> tuple[int, int]:
        """(width, height) of the kernel."""
        ks = self.kernel_size
        pair = (ks, ks) if _is_int(ks) else ks
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(_is_int(k) and 0 < k <= MAX_KERNEL and k % 2 == 1 for k in pair)
        ):
            raise ValueError(
                f"GaussianBlur: kernel_size must be an odd integer 1-{MAX_KERNEL} or two of them, got {ks!r}"
            )
        return int(pair[0]), int(pair[1])

    def sigmas(self) -> tuple[float, float]:
        """(min, max) of sigma."""
        if _is_real(self.sigma):
            lo = hi = float(self.sigma)
        else:
            lo, hi = _pair_of_numbers(self.sigma, "GaussianBlur sigma")
        if not (math.isfinite(lo) and math.isfinite(hi) and 0.0 < lo <= hi <= 1000.0):
            raise ValueError(
                f"GaussianBlur: sigma must be > 0, or (min, max) with 0 < min <= max, got {self.sigma!r}"
            )
        return lo, hi

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        lo, hi = self.sigmas()
        sigma = lo + uniforms(seed, epoch, idx, stream, 1)[:, 0] * (hi - lo)
        return _Blur(self.sizes(), sigma.astype(np.float64))


@dataclass(frozen=True)
class RandomHSV(Pixel):
    """Ultralytics' HSV gains: per sample ``r = uniform(-1, 1, 3) * (h, s, v)``; hue shifted by
    ``r[0] * 180`` and saturation and value scaled by ``1 + r[1]``, ``1 + r[2]``, as lookup tables
    in OpenCV's 8-bit HSV (pure white keeps its colour), as Ultralytics 8.3.79 and later do."""

    h: float = 0.015
    s: float = 0.7
    v: float = 0.4

    def __post_init__(self) -> None:
        for name in ("h", "s", "v"):
            value = getattr(self, name)
            if not _is_real(value) or not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"RandomHSV: {name} must be a gain in [0, 1], got {value!r}")

    PER_PIXEL = True

    def draw_stage(self, seed, epoch, idx, stream, out_hw, stats=None):
        u = uniforms(seed, epoch, idx, stream, 3)
        return _HSV((2.0 * u - 1.0) * np.array([self.h, self.s, self.v]))


# -- each one's work over a batch: its row kernel (OpenCV) and its batch kernel (torch) -------------


@dataclass(frozen=True)
class _Gray:
    chosen: np.ndarray

    def matrices(self, j: int) -> list:
        return []

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        if self.chosen[j]:
            pixelkernels.grayscale(chw)

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        rows = np.flatnonzero(self.chosen)
        if len(rows):
            index = torch.from_numpy(rows).to(x.device)
            x[index] = pixelbatch.grayscale(x[index])
        return x


@dataclass(frozen=True)
class _Blur:
    sizes: tuple[int, int]
    sigma: np.ndarray

    def matrices(self, j: int) -> list:
        return []

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        pixelkernels.gaussian_blur(chw, self.sizes, float(self.sigma[j]))

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        return pixelbatch.gaussian_blur(x, self.sizes, torch.from_numpy(self.sigma).to(x.device))


@dataclass(frozen=True)
class _HSV:
    gains: np.ndarray

    def matrices(self, j: int) -> list:
        return []

    def apply_row(self, chw: np.ndarray, j: int) -> None:
        pixelkernels.hsv(chw, self.gains[j])

    def apply_pixels(self, hwc: np.ndarray, j: int) -> None:
        pixelkernels.hsv_pixels(hwc, self.gains[j])

    def apply_batch(self, x: torch.Tensor) -> torch.Tensor:
        return pixelbatch.hsv(x, self.gains)


#: The per-sample pixel transforms, for ``compile_plan``.
PIXEL_TRANSFORMS = (
    RandAugment,
    TrivialAugmentWide,
    AutoAugment,
    RandomErasing,
    RandomGrayscale,
    GaussianBlur,
    RandomHSV,
)
