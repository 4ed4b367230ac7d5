"""Per-sample pixel transforms after the geometry: grayscale, blur, HSV gains (RandAugment's family in
``cachekit.augment.autoaugment``, erasing in ``cachekit.augment.erasing``).

Descriptions only, as ``cachekit.augment.transforms``: torchvision v2's names, parameters and
meanings (Ultralytics' for ``RandomHSV``), every bound checked here in one line. ``make_loader``
compiles them into the plan's per-sample stage (``cachekit.augment.stage``), which runs each
output row through them in list order, after the crop, resize, flip and ``ColorJitter``: in the
threads over the batch on the CPU, or batched in torch on the device. Every draw comes from
(seed, epoch, sample index), each transform its own stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import pixelbatch, pixelkernels
from .checks import check_p, is_int, is_real, pair_of_numbers
from .draws import uniforms
from .protocol import Pixel

__all__ = ["RandomGrayscale", "GaussianBlur", "RandomHSV"]

#: The widest Gaussian kernel, in pixels.
MAX_KERNEL = 255
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
        pair = (ks, ks) if is_int(ks) else ks
        if (
            not isinstance(pair, (tuple, list))
            or len(pair) != 2
            or not all(is_int(k) and 0 < k <= MAX_KERNEL and k % 2 == 1 for k in pair)
        ):
            raise ValueError(
                f"GaussianBlur: kernel_size must be an odd integer 1-{MAX_KERNEL} or two of them, got {ks!r}"
            )
        return int(pair[0]), int(pair[1])

    def sigmas(self) -> tuple[float, float]:
        """(min, max) of sigma."""
        if is_real(self.sigma):
            lo = hi = float(self.sigma)
        else:
            lo, hi = pair_of_numbers(self.sigma, "GaussianBlur sigma")
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
            if not is_real(value) or not 0.0 <= float(value) <= 1.0:
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
