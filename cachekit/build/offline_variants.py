"""Offline augmentation: K reproducible variants of every input, stored in the cache beside each other.

A variant is a random-resized crop of the decoded, upright image (torchvision's
``RandomResizedCrop`` parameters), an optional rotation, a horizontal flip and a colour jitter
(brightness, contrast, saturation, then hue). Its random draws come from a generator seeded with
``(seed, input key, variant)`` alone, where the key is a hash of the input's relative path
(``inputorder.input_key``): a build reproduces byte for byte whatever the worker count, shard layout,
order or later ``--update`` (which adds files without moving any other input's draws). Geometry runs per image (OpenCV); flips and colour run on whole batches
(broadcasting and lookup tables, see ``cachekit.ops``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import cv2
import numpy as np

from ..errors import UsageError
from ..image import ops
from ..store.manifest import ArraySpec

#: Per-sample extras of an augmented cache: the key of the input a sample came from (the variants of
#: one input share it), and which variant it is.
AUGMENT_EXTRAS = {"input_key": ArraySpec((), "<i8"), "variant": ArraySpec((), "<i4")}

__all__ = [
    "AUGMENT_EXTRAS",
    "AugmentConfig",
    "VariantParams",
    "variant_params",
    "crop_variant",
    "rotation",
    "colour_batch",
]


@dataclass(frozen=True)
class AugmentConfig:
    """How many variants per input and the ranges each random transform draws from."""

    variants: int
    seed: int = 0
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    rotate: float = 0.0  # degrees: uniform in [-rotate, rotate]

    def __post_init__(self) -> None:
        if self.variants < 1:
            raise UsageError(f"--augment must be at least 1, got {self.variants}")
        if not 0 <= self.hue <= 0.5:
            raise UsageError(f"hue jitter must be in [0, 0.5], got {self.hue}")
        strengths = (self.brightness, self.contrast, self.saturation, self.rotate, self.flip)
        if not all(math.isfinite(v) and v >= 0 for v in strengths):
            raise UsageError("augmentation strengths must be finite and not negative")
        if self.flip > 1:
            raise UsageError(f"flip probability must be in [0, 1], got {self.flip}")

    def to_json(self) -> dict:
        out = asdict(self)
        out["scale"], out["ratio"] = list(self.scale), list(self.ratio)
        return out


@dataclass(frozen=True)
class VariantParams:
    top: int
    left: int
    height: int
    width: int
    angle: float
    flip: bool
    brightness: float
    contrast: float
    saturation: float
    hue: float


def _factor(rng: np.random.Generator, strength: float) -> float:
    return float(rng.uniform(max(0.0, 1 - strength), 1 + strength)) if strength else 1.0


def variant_params(config: AugmentConfig, key: int, variant: int, height: int, width: int) -> VariantParams:
    """The random draws of variant ``variant`` of the input with key ``key`` (``height`` x ``width``)."""
    rng = np.random.default_rng([config.seed, key, variant])
    area = height * width
    log_ratio = (math.log(config.ratio[0]), math.log(config.ratio[1]))
    box = None
    for _ in range(10):  # torchvision's RandomResizedCrop.get_params
        target = area * rng.uniform(*config.scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            box = (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
            break
    if box is None:  # fall back to a central crop of the allowed aspect ratio
        aspect = width / height
        if aspect < config.ratio[0]:
            w, h = width, int(round(width / config.ratio[0]))
        elif aspect > config.ratio[1]:
            h, w = height, int(round(height * config.ratio[1]))
        else:
            w, h = width, height
        box = ((height - h) // 2, (width - w) // 2, h, w)
    return VariantParams(
        *box,
        angle=float(rng.uniform(-config.rotate, config.rotate)) if config.rotate else 0.0,
        flip=bool(rng.random() < config.flip),
        brightness=_factor(rng, config.brightness),
        contrast=_factor(rng, config.contrast),
        saturation=_factor(rng, config.saturation),
        hue=float(rng.uniform(-config.hue, config.hue)) if config.hue else 0.0,
    )


def rotation(p: VariantParams) -> np.ndarray:
    """The 2x3 map (of pixel indices, as ``warpAffine`` takes) turning a variant about its crop's centre."""
    centre = (p.left + p.width / 2.0, p.top + p.height / 2.0)
    return cv2.getRotationMatrix2D(centre, p.angle, 1.0)


def crop_variant(img: np.ndarray, p: VariantParams, out_hw: tuple[int, int]) -> np.ndarray:
    """The geometric part: rotate about the crop's centre (if asked), crop, resize to ``out_hw``."""
    if p.angle:
        img = cv2.warpAffine(img, rotation(p), (img.shape[1], img.shape[0]), flags=cv2.INTER_LINEAR)
    crop = img[p.top : p.top + p.height, p.left : p.left + p.width]
    h, w = out_hw
    return cv2.resize(crop, (w, h), interpolation=ops.interpolation_for(crop.shape[:2], (h, w)))


def colour_batch(images: np.ndarray, params: list[VariantParams]) -> np.ndarray:
    """Flip, brightness, contrast, saturation and hue of ``[N, H, W, 3]`` images, batch by batch."""
    out = ops.hflip_batch(images, np.array([p.flip for p in params]))
    out = ops.adjust_brightness_batch(out, np.array([p.brightness for p in params]))
    out = ops.adjust_contrast_batch(out, np.array([p.contrast for p in params]))
    out = ops.adjust_saturation_batch(out, np.array([p.saturation for p in params]))
    hue = np.array([p.hue for p in params])
    if hue.any():
        out = ops.adjust_hue_batch(out, hue)
    return out
