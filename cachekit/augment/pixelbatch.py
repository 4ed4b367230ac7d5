"""Pixel kernels of the per-sample stage on a float batch in torch, on whatever device it is.

The same operations as ``cachekit.augment.pixelkernels`` with a parameter per sample, on
``x [n, C, H, W]`` float holding whole values 0-255 (each result rounded back to whole values, so
the batch goes on as the uint8 rows of the CPU path would): blends round as OpenCV does, lookup
ops compute torchvision's tables, ``affine`` reproduces OpenCV's nearest ``warpAffine`` index
choice of pixel (to rounding errors at halves), ``hsv`` OpenCV's 8-bit HSV.
"""

from __future__ import annotations

import functools

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .colour import GRAY
from .pixelkernels import TV_GRAY, hsv_tables

__all__ = [
    "brightness",
    "color",
    "contrast",
    "sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
    "invert",
    "affine",
    "grayscale",
    "gaussian_blur",
    "hsv",
]


def _col(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.float32).view(-1, 1, 1, 1)


def _blend(x: torch.Tensor, other: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    f = _col(f)
    return (x * f + other * (1.0 - f)).round_().clamp_(0, 255)


def brightness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (x * _col(f)).round_().clamp_(0, 255)


def color(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    if x.shape[1] != 3:
        return x
    gray = torch.floor(GRAY[0] * x[:, 0:1] + GRAY[1] * x[:, 1:2] + GRAY[2] * x[:, 2:3] + 0.5)
    return _blend(x, gray, f)


def contrast(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 3:
        means = x.mean(dim=(2, 3))
        mean = (GRAY[0] * means[:, 0] + GRAY[1] * means[:, 1] + GRAY[2] * means[:, 2]).view(-1, 1, 1, 1)
    else:
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return _blend(x, mean, f)


def sharpness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    n, c, h, w = x.shape
    if h <= 2 or w <= 2:
        return x
    kernel = torch.ones(3, 3, device=x.device)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13.0).view(1, 1, 3, 3)
    smooth = F.conv2d(x.reshape(n * c, 1, h, w), kernel).reshape(n, c, h - 2, w - 2).round_()
    out = x.clone()
    out[:, :, 1:-1, 1:-1] = _blend(x[:, :, 1:-1, 1:-1], smooth, f)
    return out


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    bits = bits.to(torch.int64)
    masks = (((1 << bits) - 1) << (8 - bits)).clamp(max=255).to(torch.uint8).view(-1, 1, 1, 1)
    return (x.to(torch.uint8) & masks).to(x.dtype)


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    at = torch.ceil(threshold.to(torch.float64)).to(x.dtype).view(-1, 1, 1, 1)  # exact for whole values
    return torch.where(x >= at, 255.0 - x, x)


def autocontrast(x: torch.Tensor) -> torch.Tensor:
    low = x.amin(dim=(2, 3), keepdim=True)
    high = x.amax(dim=(2, 3), keepdim=True)
    same = high == low
    inv_scale = torch.where(same, torch.ones_like(high), (high - low) * np.float32(1.0 / 255.0))
    low = torch.where(same, torch.zeros_like(low), low)
    return ((x - low) / inv_scale).clamp_(0, 255).floor_()


def equalize(x: torch.Tensor) -> torch.Tensor:
    """Each channel's histogram equalised, PIL's table (torchvision v2's batched form)."""
    n, c, h, w = x.shape
    flat = x.reshape(n * c, h * w).to(torch.int64)
    hist = torch.zeros(n * c, 256, dtype=torch.int64, device=x.device)
    hist.scatter_add_(1, flat, torch.ones_like(flat))
    cum = hist.cumsum(dim=1)
    last = cum.argmax(dim=1, keepdim=True)  # the first bin holding the total: the last non-empty one
    step = torch.div(h * w - hist.gather(1, last), 255, rounding_mode="floor")
    table = torch.div(cum[:, :-1] + step // 2, step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    table = torch.cat([torch.zeros_like(table[:, :1]), table], dim=1)
    out = torch.where(step > 0, table.gather(1, flat), flat)
    return out.to(x.dtype).reshape(n, c, h, w)


def invert(x: torch.Tensor) -> torch.Tensor:
    return 255.0 - x


def affine(x: torch.Tensor, inverse: torch.Tensor, fill: tuple[int, ...]) -> torch.Tensor:
    """Each sample through its own inverse 2x3 map ``[n, 2, 3]`` (output index -> source index),
    nearest: the source pixel ``floor(coordinate + 0.5)`` (in float64), as OpenCV's nearest
    ``warpAffine`` picks it but for coordinates within a rounding error of a half (a few pixels in
    ten thousand); ``fill`` outside the source."""
    n, c, h, w = x.shape
    m = inverse.to(device=x.device, dtype=torch.float64)
    xs = torch.arange(w, device=x.device, dtype=torch.float64)[None, None, :]
    ys = torch.arange(h, device=x.device, dtype=torch.float64)[None, :, None]

    def coordinate(row: int) -> torch.Tensor:
        a, b, t = (m[:, row, k, None, None] for k in range(3))
        return torch.floor(a * xs + b * ys + t + 0.5).to(torch.int64)  # [n, h, w]

    sx, sy = coordinate(0), coordinate(1)
    inside = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    index = (sy.clamp(0, h - 1) * w + sx.clamp(0, w - 1)).reshape(n, 1, h * w).expand(n, c, h * w)
    out = x.reshape(n, c, h * w).gather(2, index).reshape(n, c, h, w)
    values = torch.tensor([float(fill[k % len(fill)]) for k in range(c)], device=x.device).view(1, c, 1, 1)
    return torch.where(inside[:, None], out, values)


def grayscale(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] != 3:
        return x
    gray = torch.floor(TV_GRAY[0] * x[:, 0:1] + TV_GRAY[1] * x[:, 1:2] + TV_GRAY[2] * x[:, 2:3])
    return gray.expand_as(x).contiguous()


def _gaussian(size: int, sigma: torch.Tensor) -> torch.Tensor:
    """``[n, size]`` normalised Gaussian kernels, one per sigma (float64 weights, as OpenCV's)."""
    t = torch.arange(size, device=sigma.device, dtype=torch.float64) - (size - 1) / 2
    k = torch.exp(-(t[None, :] ** 2) / (2 * sigma.to(torch.float64)[:, None] ** 2))
    return k / k.sum(dim=1, keepdim=True)


def _reflect_index(size: int, pad: int, device) -> torch.Tensor:
    """Indices of a row padded by ``pad`` on each side, reflected without repeating the edge."""
    i = torch.arange(-pad, size + pad, device=device)
    if size == 1:
        return torch.zeros_like(i)
    period = 2 * (size - 1)
    i = torch.remainder(i, period)
    return torch.where(i >= size, period - i, i)


def gaussian_blur(x: torch.Tensor, sizes: tuple[int, int], sigma: torch.Tensor) -> torch.Tensor:
    """Separable Gaussian per sample (``sizes`` = (width, height)), borders reflected (OpenCV's 101)."""
    n, c, h, w = x.shape
    kx, ky = sizes
    wx = _gaussian(kx, sigma).to(torch.float32)
    wy = _gaussian(ky, sigma).to(torch.float32)
    padded = x[:, :, :, _reflect_index(w, kx // 2, x.device)]
    cols = padded.unfold(3, kx, 1)  # [n, c, h, w, kx]
    rows = torch.einsum("nchwk,nk->nchw", cols, wx)
    rows = rows[:, :, _reflect_index(h, ky // 2, x.device), :]
    out = torch.einsum("nchwk,nk->nchw", rows.unfold(2, ky, 1), wy)
    return out.round_().clamp_(0, 255)


_SHIFT = 12
_SDIV = torch.tensor([0] + [int(np.rint((255 << _SHIFT) / i)) for i in range(1, 256)], dtype=torch.int64)
_HDIV = torch.tensor(
    [0] + [int(np.rint((180 << _SHIFT) / (6.0 * i))) for i in range(1, 256)], dtype=torch.int64
)
#: OpenCV's sector table: which of (v, p, q, t) are blue, green and red in each sixth of the hue circle.
_SECTORS = torch.tensor([[1, 3, 0], [1, 0, 2], [3, 0, 1], [0, 2, 1], [0, 1, 3], [2, 1, 0]], dtype=torch.int64)


def _rgb_to_hsv8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """OpenCV's 8-bit RGB -> HSV (hue 0-179), its fixed-point arithmetic, as int64 planes."""
    r, g, b = x.to(torch.int64).unbind(1)
    v = torch.maximum(torch.maximum(r, g), b)
    diff = v - torch.minimum(torch.minimum(r, g), b)
    sdiv, hdiv = _SDIV.to(x.device), _HDIV.to(x.device)
    half = 1 << (_SHIFT - 1)
    s = torch.div(diff * sdiv[v] + half, 1 << _SHIFT, rounding_mode="floor")
    h = torch.where(v == r, g - b, torch.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = torch.div(h * hdiv[diff] + half, 1 << _SHIFT, rounding_mode="floor")
    return torch.where(h < 0, h + 180, h), s, v


def _hsv8_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit HSV -> RGB: float32 arithmetic, to whole values as the installed OpenCV does."""
    return _hsv_levels(_hsv_values(h, s, v), opencv_hsv_run())


def _hsv_values(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """OpenCV's 8-bit HSV -> RGB before its last step: RGB times 255 in float32."""
    hf = h.to(torch.float32) * np.float32(6.0 / 180.0)
    sf = s.to(torch.float32) * np.float32(1.0 / 255.0)
    vf = v.to(torch.float32) * np.float32(1.0 / 255.0)
    hf = torch.remainder(hf, 6.0)
    sector = torch.floor(hf)
    frac = hf - sector
    sector = sector.to(torch.int64).clamp_(0, 5)
    tab = torch.stack([vf, vf * (1 - sf), vf * (1 - sf * frac), vf * (1 - sf * (1 - frac))], dim=1)
    picks = _SECTORS.to(h.device)[sector]  # [n, H, W, 3]: b, g, r
    bgr = tab.gather(1, picks.permute(0, 3, 1, 2))
    rgb = torch.where((s == 0)[:, None], vf[:, None].expand_as(bgr), bgr).flip(1)
    return rgb * 255.0


def _hsv_levels(values: torch.Tensor, run: int) -> torch.Tensor:
    """``values [..., W]`` to whole levels as OpenCV's 8-bit HSV -> RGB does: rounded (``run`` 0), or
    truncated in its vector loop of ``run`` pixels and rounded in each row's last ``W % run``."""
    if not run:
        return values.round_().clamp_(0, 255)
    w = values.shape[-1]
    tail = torch.arange(w, device=values.device) >= w - w % run
    return torch.where(tail, values.round(), values.floor()).clamp_(0, 255)


@functools.cache
def opencv_hsv_run() -> int:
    """How the installed OpenCV rounds 8-bit HSV -> RGB, found once by converting a probe row: 0 when
    it rounds every value (OpenCV 4); else the pixels of its vector loop, which truncates (OpenCV 5:
    16, 32 or 64 with the CPU's vector width), a row's last ``width % run`` pixels being rounded."""
    rng = np.random.default_rng(0)
    hsv = np.stack(
        [rng.integers(0, 180, (1, 127)), rng.integers(1, 256, (1, 127)), rng.integers(1, 256, (1, 127))], -1
    ).astype(np.uint8)
    got = torch.from_numpy(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB).transpose(2, 0, 1)).to(torch.float32)
    values = _hsv_values(*(torch.from_numpy(hsv[None, ..., k].astype(np.int64)) for k in range(3)))[0]
    misses = {run: int((_hsv_levels(values.clone(), run) != got).sum()) for run in (0, 16, 32, 64, 128)}
    return min(misses, key=lambda run: (misses[run], run))


def hsv(x: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """Ultralytics' HSV gains per sample (``gains [n, 3]``, host tables), in OpenCV's 8-bit HSV."""
    if x.shape[1] != 3:
        return x
    tables = torch.from_numpy(
        np.stack([np.stack(hsv_tables(g)) for g in np.asarray(gains, dtype=np.float64)]).astype(np.int64)
    ).to(x.device)  # [n, 3, 256]
    h, s, v = _rgb_to_hsv8(x)
    n = x.shape[0]
    looked = [tables[:, k].gather(1, p.reshape(n, -1)).reshape(p.shape) for k, p in enumerate((h, s, v))]
    return _hsv8_to_rgb(*looked)
