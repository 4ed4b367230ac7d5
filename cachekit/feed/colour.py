"""Colour jitter (brightness, contrast, saturation, hue, in that order) and normalisation.

Two implementations of the same operations (torchvision's definitions, each result clamped):
``jitter_planes`` works in place on one uint8 channels-first sample with OpenCV (saturating
weighted sums, 8-bit HSV), cache-friendly in a thread per batch slice; ``jitter_batch`` works on a
whole float batch with torch, on whatever device it is. They agree to rounding, and hue to the
8-bit HSV quantisation of the OpenCV path (a 256th of a turn).
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

__all__ = ["jitter_planes", "jitter_batch", "GRAY"]

#: RGB -> gray weights (ITU-R 601), as torchvision's ``rgb_to_grayscale``.
GRAY = (0.299, 0.587, 0.114)


def _gray_u8(chw: np.ndarray) -> np.ndarray:
    """The gray image of a uint8 sample, rounded to 8 bits."""
    gray = cv2.addWeighted(chw[0], GRAY[0], chw[1], GRAY[1], 0.5, dtype=cv2.CV_32F)
    gray = cv2.scaleAdd(chw[2].astype(np.float32), GRAY[2], gray)
    return gray.astype(np.uint8)  # non-negative: truncating x + 0.5 rounds


def jitter_planes(chw: np.ndarray, factors: np.ndarray) -> None:
    """Jitter one uint8 ``[3, H, W]`` sample in place; ``factors`` = (brightness, contrast, saturation, hue).

    Brightness and contrast are saturating weighted sums over the whole sample at once (the mean
    gray level for contrast is taken after brightness, from the channels' means), saturation is
    one 8-bit weighted sum per channel with the gray image, hue one trip through OpenCV's 8-bit HSV.
    """
    brightness, contrast, saturation, hue = (float(v) for v in factors)
    flat = chw.reshape(-1, chw.shape[-1])  # the three planes as one 2-D image: one call each
    if brightness != 1.0:
        cv2.addWeighted(flat, brightness, flat, 0.0, 0.0, dst=flat)
    if contrast != 1.0:
        mean = sum(w * cv2.mean(chw[c])[0] for c, w in enumerate(GRAY))
        cv2.addWeighted(flat, contrast, flat, 0.0, (1.0 - contrast) * mean, dst=flat)
    if saturation != 1.0:
        gray = _gray_u8(chw)
        for c in range(3):
            cv2.addWeighted(chw[c], saturation, gray, 1.0 - saturation, 0.0, dst=chw[c])
    if hue != 0.0:
        hsv = cv2.cvtColor(cv2.merge([chw[0], chw[1], chw[2]]), cv2.COLOR_RGB2HSV_FULL)
        shift = ((np.arange(256, dtype=np.int32) + int(round(hue * 256))) % 256).astype(np.uint8)
        hsv[..., 0] = cv2.LUT(hsv[..., 0], shift)
        cv2.split(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL), [chw[0], chw[1], chw[2]])


def _gray(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(1)
    return (GRAY[0] * r + GRAY[1] * g + GRAY[2] * b).unsqueeze(1)


def _rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(1)
    maxc, _ = x.max(dim=1)
    minc, _ = x.min(dim=1)
    delta = maxc - minc
    sat = torch.where(maxc > 0, delta / maxc.clamp(min=1e-12), torch.zeros_like(maxc))
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    rc, gc, bc = (maxc - r) / safe, (maxc - g) / safe, (maxc - b) / safe
    hue = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    hue = torch.where(delta > 0, (hue / 6.0) % 1.0, torch.zeros_like(hue))
    return torch.stack([hue, sat, maxc], dim=1)


def _hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    h, s, v = x.unbind(1)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.to(torch.int64) % 6
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = [torch.zeros_like(v) for _ in range(3)]
    for k, rgb in enumerate(choices):
        mask = i == k
        for c in range(3):
            out[c] = torch.where(mask, rgb[c], out[c])
    return torch.stack(out, dim=1)


def jitter_batch(x: torch.Tensor, factors: torch.Tensor, hue: bool = True) -> torch.Tensor:
    """Jitter a float ``[B, 3, H, W]`` batch with values in [0, 255]; ``factors`` is ``[B, 4]``.

    ``hue=False`` skips the hue rotation (every shift is zero): the caller knows without a sync.
    """
    f = factors.to(device=x.device, dtype=torch.float32)
    b, c, s, h = (f[:, k].view(-1, 1, 1, 1) for k in range(4))
    x = (x * b).clamp_(0, 255)
    mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    x = (x * c + mean * (1 - c)).clamp_(0, 255)
    x = (x * s + _gray(x) * (1 - s)).clamp_(0, 255)
    if hue:
        hsv = _rgb_to_hsv(x / 255.0)
        hsv = torch.stack([(hsv[:, 0] + h[:, 0]) % 1.0, hsv[:, 1], hsv[:, 2]], dim=1)
        x = _hsv_to_rgb(hsv) * 255.0
    return x
