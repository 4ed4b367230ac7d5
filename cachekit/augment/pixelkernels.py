"""Pixel kernels of the per-sample stage on one uint8 channels-first row, in place, with OpenCV and numpy.

Each is torchvision v2's functional op on a uint8 tensor (Ultralytics' for ``hsv``), one call per
plane or per row (OpenCV releases the GIL, so the threads over a batch run them side by side):
lookup-table ops (posterize, solarize, autocontrast, equalize, invert) give torchvision's very
values; blends (brightness, color, contrast, sharpness) round where torchvision's uint8 kernels
truncate, as ``ColorJitter`` here does (one level at most); ``affine`` is OpenCV's nearest
``warpAffine``, torchvision's default interpolation for these ops.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from ..image.scratch import scratch
from .colour import GRAY

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
    "hsv_pixels",
    "erase",
    "TV_GRAY",
]

#: torchvision's ``rgb_to_grayscale`` weights (its ``Grayscale``; its colour ops' gray is ITU-R 601's).
TV_GRAY = (0.2989, 0.587, 0.114)
_LEVELS = np.arange(256, dtype=np.int64)


def _flat(chw: np.ndarray) -> np.ndarray:
    """The planes as one 2-D image (one OpenCV call for all of them)."""
    return chw.reshape(-1, chw.shape[-1])


def _gray_u8(chw: np.ndarray) -> np.ndarray:
    """The sample's gray, rounded (x + 0.5 truncated), in this thread's scratch plane ``gray``."""
    shape = chw.shape[1:]
    gray = _scratch_of("gray32", shape, np.float32)
    blue = _scratch_of("blue32", shape, np.float32)
    _filled(cv2.addWeighted(chw[0], GRAY[0], chw[1], GRAY[1], 0.5, dst=gray, dtype=cv2.CV_32F), gray)
    np.copyto(blue, chw[2])
    _filled(cv2.scaleAdd(blue, GRAY[2], gray, dst=gray), gray)
    out = _scratch("gray", shape)
    np.copyto(out, gray, casting="unsafe")  # truncated, as numpy's astype
    return out


def brightness(chw: np.ndarray, factor: float) -> None:
    """Blend with black: ``x * factor``."""
    flat = _flat(chw)
    cv2.addWeighted(flat, float(factor), flat, 0.0, 0.0, dst=flat)


def color(chw: np.ndarray, factor: float) -> None:
    """Blend with the sample's gray (saturation); a one-channel sample is left as it is."""
    if chw.shape[0] != 3:
        return
    gray = _gray_u8(chw)
    for c in range(3):
        cv2.addWeighted(chw[c], float(factor), gray, 1.0 - float(factor), 0.0, dst=chw[c])


def contrast(chw: np.ndarray, factor: float) -> None:
    """Blend with the mean of the sample's gray."""
    if chw.shape[0] == 3:
        mean = sum(w * cv2.mean(chw[c])[0] for c, w in enumerate(GRAY))
    else:
        mean = float(chw.mean())
    flat = _flat(chw)
    cv2.addWeighted(flat, float(factor), flat, 0.0, (1.0 - float(factor)) * mean, dst=flat)


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13.0


def sharpness(chw: np.ndarray, factor: float) -> None:
    """Blend with the 3x3 smoothed sample (``[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13``), borders kept."""
    if chw.shape[1] <= 2 or chw.shape[2] <= 2:
        return
    # the planes as one image: an interior pixel's neighbours all lie in its own plane (the rows where
    # planes meet are borders, which are kept), so one filter serves them all
    flat = _flat(chw)
    smooth = _scratch("smooth", flat.shape)  # this thread's: no fresh array per sample
    _filled(cv2.filter2D(flat, -1, _SMOOTH, dst=smooth, borderType=cv2.BORDER_REPLICATE), smooth)
    _filled(cv2.addWeighted(flat, float(factor), smooth, 1.0 - float(factor), 0.0, dst=smooth), smooth)
    chw[:, 1:-1, 1:-1] = smooth.reshape(chw.shape)[:, 1:-1, 1:-1]


def posterize(chw: np.ndarray, bits: int) -> None:
    """Keep the ``bits`` high bits of every value."""
    if bits < 8:
        np.bitwise_and(chw, np.uint8(((1 << int(bits)) - 1) << (8 - int(bits))), out=chw)


def solarize(chw: np.ndarray, threshold: float) -> None:
    """Invert every value at or above ``threshold``: a mask of those values (255 where a value is
    above ``ceil(threshold) - 1``) xor-ed in, as ``255 - x`` is ``x ^ 255`` (two OpenCV passes, no
    boolean array)."""
    threshold = float(threshold)
    if math.isnan(threshold):
        return
    below = math.ceil(threshold) - 1 if math.isfinite(threshold) else (-1 if threshold < 0 else 255)
    flat = _flat(chw)
    if below >= 255:
        return
    if below < 0:
        cv2.bitwise_not(flat, dst=flat)
        return
    mask = _scratch("mask", flat.shape)
    _filled(cv2.threshold(flat, below, 255, cv2.THRESH_BINARY, dst=mask)[1], mask)
    cv2.bitwise_xor(flat, mask, dst=flat)


def autocontrast(chw: np.ndarray) -> None:
    """Stretch each channel's range to 0-255 (truncated, in float32, as torchvision)."""
    for plane in chw:
        low, high, _, _ = cv2.minMaxLoc(plane)
        if high == low:
            continue
        inv_scale = np.float32(high - low) * np.float32(1.0 / 255.0)
        table = (_LEVELS.astype(np.float32) - np.float32(low)) / inv_scale
        cv2.LUT(plane, np.clip(table, 0, 255).astype(np.uint8), dst=plane)


def equalize_table(hist: np.ndarray) -> np.ndarray | None:
    """PIL's and torchvision's equalisation table of a 256-bin histogram (None: leave as it is)."""
    last = int(np.flatnonzero(hist)[-1]) if hist.any() else 0
    step = (int(hist.sum()) - int(hist[last])) // 255
    if step == 0:
        return None
    cum = np.cumsum(hist)[:-1]
    return np.concatenate([[0], np.clip((cum + step // 2) // step, 0, 255)]).astype(np.uint8)


def equalize(chw: np.ndarray) -> None:
    """Equalise each channel's histogram."""
    for plane in chw:
        table = equalize_table(cv2.calcHist([plane], [0], None, [256], [0, 256]).reshape(-1).astype(np.int64))
        if table is not None:
            cv2.LUT(plane, table, dst=plane)


def invert(chw: np.ndarray) -> None:
    flat = _flat(chw)
    cv2.bitwise_not(flat, dst=flat)


def affine(chw: np.ndarray, matrix: np.ndarray, fill: tuple[int, ...]) -> None:
    """Warp by the forward 2x3 map of pixel indices ``matrix``, nearest; ``fill`` where it uncovers.

    Three or four planes are merged into this thread's channels-last scratch and warped at once
    (OpenCV's nearest warp costs nearly as much per pixel for one channel as for three: the merge,
    one warp and the split take 0.8x three warps of planes at 224 x 224), but for whole-pixel
    translations, which OpenCV warps plane by plane faster than that; others, plane by plane."""
    c, h, w = chw.shape
    fills = [int(fill[k % len(fill)]) for k in range(c)]
    if c in (3, 4) and not _translation(matrix):
        planes = list(chw)
        pixels, warped = _scratch("pixels", (h, w, c)), _scratch("warped", (h, w, c))
        _filled(cv2.merge(planes, dst=pixels), pixels)
        _filled(cv2.warpAffine(pixels, matrix, (w, h), dst=warped, flags=cv2.INTER_NEAREST,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(fills)), warped)  # fmt: skip
        _filled_all(cv2.split(warped, planes), planes)
        return
    for plane, value in zip(chw, fills):
        plane[...] = cv2.warpAffine(plane, matrix, (w, h), flags=cv2.INTER_NEAREST,
                                    borderMode=cv2.BORDER_CONSTANT, borderValue=value)  # fmt: skip


def _translation(matrix: np.ndarray) -> bool:
    """Whether ``matrix`` moves every pixel by the same whole number of pixels."""
    linear = matrix[0, 0] == 1 and matrix[1, 1] == 1 and matrix[0, 1] == 0 and matrix[1, 0] == 0
    return bool(linear and float(matrix[0, 2]).is_integer() and float(matrix[1, 2]).is_integer())


def grayscale(chw: np.ndarray) -> None:
    """Every channel becomes torchvision's gray (its weights, truncated); one channel stays."""
    if chw.shape[0] != 3:
        return
    gray = cv2.addWeighted(chw[0], TV_GRAY[0], chw[1], TV_GRAY[1], 0.0, dtype=cv2.CV_32F)
    gray = cv2.scaleAdd(chw[2].astype(np.float32), TV_GRAY[2], gray).astype(np.uint8)
    chw[...] = gray


def gaussian_blur(chw: np.ndarray, sizes: tuple[int, int], sigma: float) -> None:
    """Blur each plane with a ``sizes`` (width, height) Gaussian of ``sigma``, borders reflected."""
    for plane in chw:
        cv2.GaussianBlur(
            plane,
            sizes,
            sigmaX=float(sigma),
            sigmaY=float(sigma),
            dst=plane,
            borderType=cv2.BORDER_REFLECT_101,
        )


def hsv_tables(gains: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ultralytics' lookup tables for hue (OpenCV's 0-179), saturation and value, from ``r`` (3 gains)."""
    x = np.arange(256, dtype=np.float64)
    hue = ((x + gains[0] * 180) % 180).astype(np.uint8)
    sat = np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8)
    val = np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)
    sat[0] = 0  # pure white keeps its colour
    return hue, sat, val


def hsv(chw: np.ndarray, gains: np.ndarray) -> None:
    """Ultralytics' ``RandomHSV`` with gains ``r``: LUTs in OpenCV's 8-bit HSV; not RGB: unchanged."""
    if chw.shape[0] != 3:
        return
    pixels = cv2.merge([chw[0], chw[1], chw[2]])
    hsv_pixels(pixels, gains)
    cv2.split(pixels, [chw[0], chw[1], chw[2]])


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """This thread's reusable uint8 buffer ``name`` of ``shape`` (a fresh 640 x 640 x 3 array costs its
    page faults each sample: about as much as a colour conversion)."""
    return _scratch_of(name, shape, np.uint8)


def _scratch_of(name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """This thread's reusable buffer ``name`` of ``shape`` and ``dtype`` (``image.scratch``: 16 bytes
    past a 64-byte boundary, off the grid of OpenCV's non-temporal stores)."""
    return scratch(f"pixelkernels.{name}", shape, dtype)


def hsv_pixels(pixels: np.ndarray, gains: np.ndarray) -> None:
    """``hsv`` on channels-last RGB pixels ``[h, w, 3]`` (rows contiguous), in place: to OpenCV's HSV,
    a table per channel, back to RGB. Not RGB: unchanged.

    The tables go on the HSV pixels' three planes (a split, three one-channel LUTs, a merge into the
    HSV buffer): OpenCV's LUT with one ``[256, 1, 3]`` table gives the same bytes and costs more than
    all of that (measured on 640 x 640: 0.74 against 0.45 ms)."""
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        return
    h, w = pixels.shape[:2]
    hsv_buffer = _scratch("hsv", (h, w, 3))
    planes = [_scratch(f"plane{c}", (h, w)) for c in range(3)]
    _filled(cv2.cvtColor(pixels, cv2.COLOR_RGB2HSV, dst=hsv_buffer), hsv_buffer)
    _filled_all(cv2.split(hsv_buffer, planes), planes)
    for plane, table in zip(planes, hsv_tables(gains)):
        _filled(cv2.LUT(plane, table, dst=plane), plane)
    _filled(cv2.merge(planes, hsv_buffer), hsv_buffer)
    _filled(cv2.cvtColor(hsv_buffer, cv2.COLOR_HSV2RGB, dst=pixels), pixels)


def _filled(result: np.ndarray, dst: np.ndarray) -> None:
    """``dst`` holds ``result``: OpenCV wrote into it, or (should it hand back its own array) a copy does."""
    if result is not dst:
        dst[...] = result.reshape(dst.shape)


def _filled_all(results, dsts) -> None:
    for result, dst in zip(results, dsts):
        _filled(result, dst)


def erase(chw: np.ndarray, box, values: np.ndarray) -> None:
    """Set the box ``(top, left, height, width)`` to ``values`` (one per channel, or ``[C, h, w]``)."""
    top, left, h, w = (int(v) for v in box)
    region = chw[:, top : top + h, left : left + w]
    region[...] = values if values.ndim == 3 else values.reshape(-1, 1, 1)
