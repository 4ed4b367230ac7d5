"""Colour jitter (brightness, contrast, saturation, hue, in each sample's own random order) and normalisation.

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


def _brightness(chw: np.ndarray, f: float) -> None:
    flat = chw.reshape(-1, chw.shape[-1])  # the three planes as one 2-D image: one call
    cv2.addWeighted(flat, f, flat, 0.0, 0.0, dst=flat)


def _contrast(chw: np.ndarray, f: float) -> None:
    flat = chw.reshape(-1, chw.shape[-1])
    mean = sum(w * cv2.mean(chw[c])[0] for c, w in enumerate(GRAY))
    cv2.addWeighted(flat, f, flat, 0.0, (1.0 - f) * mean, dst=flat)


def _saturation(chw: np.ndarray, f: float) -> None:
    gray = _gray_u8(chw)
    for c in range(3):
        cv2.addWeighted(chw[c], f, gray, 1.0 - f, 0.0, dst=chw[c])


def _hue(chw: np.ndarray, shift: float) -> None:
    hsv = cv2.cvtColor(cv2.merge([chw[0], chw[1], chw[2]]), cv2.COLOR_RGB2HSV_FULL)
    table = ((np.arange(256, dtype=np.int32) + int(round(shift * 256))) % 256).astype(np.uint8)
    hsv[..., 0] = cv2.LUT(hsv[..., 0], table)
    cv2.split(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL), [chw[0], chw[1], chw[2]])


#: The four jitter operations by their index in a factors row, and the value that does nothing.
_PLANE_OPS = ((_brightness, 1.0), (_contrast, 1.0), (_saturation, 1.0), (_hue, 0.0))


def jitter_planes(chw: np.ndarray, factors: np.ndarray, order=(0, 1, 2, 3)) -> None:
    """Jitter one uint8 ``[3, H, W]`` sample in place; ``factors`` = (brightness, contrast, saturation,
    hue), applied in ``order`` (a permutation of 0-3, torchvision draws one per sample).

    Brightness and contrast are saturating weighted sums over the whole sample at once (contrast's
    mean gray level is taken from the image as it is then), saturation is one 8-bit weighted sum
    per channel with the gray image, hue one trip through OpenCV's 8-bit HSV.
    """
    for k in order:
        op, identity = _PLANE_OPS[int(k)]
        value = float(factors[int(k)])
        if value != identity:
            op(chw, value)


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


def _batch_op(x: torch.Tensor, k: int, f: torch.Tensor) -> torch.Tensor:
    """Operation ``k`` (brightness, contrast, saturation, hue) on float ``[n, 3, H, W]`` in [0, 255]."""
    f = f.view(-1, 1, 1, 1)
    if k == 0:
        return (x * f).clamp_(0, 255)
    if k == 1:
        mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
        return (x * f + mean * (1 - f)).clamp_(0, 255)
    if k == 2:
        return (x * f + _gray(x) * (1 - f)).clamp_(0, 255)
    hsv = _rgb_to_hsv(x / 255.0)
    hsv = torch.stack([(hsv[:, 0] + f[:, 0]) % 1.0, hsv[:, 1], hsv[:, 2]], dim=1)
    return _hsv_to_rgb(hsv) * 255.0


def jitter_batch(
    x: torch.Tensor, factors: torch.Tensor, hue: bool = True, order: torch.Tensor | None = None
) -> torch.Tensor:
    """Jitter a float ``[B, 3, H, W]`` batch with values in [0, 255]; ``factors`` is ``[B, 4]``.

    ``order`` (int ``[B, 4]`` on the host, each row a permutation of 0-3; default the listed order) says which
    operation each sample does at each of the four steps: every step runs each operation once, on
    the samples whose turn it is. ``hue=False`` skips the hue rotation (every shift is zero): the
    caller knows without a sync.
    """
    f = factors.to(device=x.device, dtype=torch.float32)
    if order is None:
        for k in range(4 if hue else 3):
            x = _batch_op(x, k, f[:, k])
        return x
    order = order.cpu().numpy()  # on the host: who does what is known without a device sync
    x = x.clone()
    for step in range(4):
        for k in range(4 if hue else 3):
            rows = np.flatnonzero(order[:, step] == k)
            if len(rows):
                idx = torch.from_numpy(rows).to(x.device, non_blocking=True)
                x[idx] = _batch_op(x[idx], k, f[idx, k])
    return x
