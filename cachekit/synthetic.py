"""Synthetic ImageNet-like raw folders: varied, photo-like JPEGs, for benchmarks and demos.

Each image mixes a smooth colour field, random shapes, fine texture and sensor-like noise, so it
compresses and decodes like a photograph (not like a flat colour, which JPEG makes trivially small).
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

__all__ = ["synthetic_image", "make_synthetic_folder"]


def synthetic_image(rng: np.random.Generator, height: int = 375, width: int = 500) -> np.ndarray:
    """One photo-like RGB uint8 image ``[H, W, 3]``."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        f = rng.uniform(0.002, 0.02)
        img[..., c] = 128 + 90 * np.sin(f * (a * xx + b * yy) + p * np.pi)
    for _ in range(int(rng.integers(4, 12))):
        colour = tuple(float(v) for v in rng.uniform(0, 255, 3))
        center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        if rng.random() < 0.5:
            axes = (int(rng.integers(10, width // 3)), int(rng.integers(10, height // 3)))
            cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
        else:
            pts = rng.integers(0, [width, height], size=(int(rng.integers(3, 7)), 2)).astype(np.int32)
            cv2.fillPoly(img, [pts], colour, cv2.LINE_AA)
    texture = rng.normal(0, 1, (height // 4 + 1, width // 4 + 1, 3)).astype(np.float32)
    texture = cv2.resize(texture, (width, height), interpolation=cv2.INTER_CUBIC)[:height, :width]
    img += 18 * texture + rng.normal(0, 4, img.shape).astype(np.float32)
    img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.3, 1.2)))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_synthetic_folder(
    root: str | os.PathLike,
    n: int,
    *,
    classes: int = 10,
    size: tuple[int, int] = (375, 500),
    quality: int = 90,
    seed: int = 0,
) -> Path:
    """Write ``n`` JPEGs into ``root/<class>/`` (ImageFolder layout), sizes jittered around ``size``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        h = int(size[0] * rng.uniform(0.85, 1.15))
        w = int(size[1] * rng.uniform(0.85, 1.15))
        if rng.random() < 0.3:
            h, w = w, h
        rgb = synthetic_image(rng, h, w)
        ok, buf = cv2.imencode(
            ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
        )
        if not ok:  # pragma: no cover - OpenCV always encodes JPEG
            raise RuntimeError("JPEG encoding failed")
        (root / f"class_{i % classes:03d}" / f"img_{i:07d}.jpg").write_bytes(buf.tobytes())
    return root
