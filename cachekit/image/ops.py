"""Image operations on numpy arrays with OpenCV: decode, resize, crop, letterbox, batched colour ops.

Images are ``uint8`` arrays of shape ``[H, W, 3]`` in RGB order while they are processed; the cache
stores them channels-first. Batched operations take ``[N, H, W, 3]`` and work on the whole batch at
once (broadcasting, lookup tables), never pixel by pixel in Python.
"""

from __future__ import annotations

import cv2
import numpy as np

from .scratch import scratch

__all__ = [
    "DecodeError",
    "decode",
    "to_uint8",
    "resize_shorter",
    "resize_longer",
    "center_crop",
    "letterbox",
    "interpolation_for",
    "hflip_batch",
    "adjust_brightness_batch",
    "adjust_contrast_batch",
    "adjust_saturation_batch",
    "adjust_hue_batch",
    "normalize_batch",
    "hwc_into_planes",
    "planes_into_hwc",
    "planes_as_pixels",
]


class DecodeError(ValueError):
    """The bytes are not an image OpenCV can decode."""


_REDUCED = {
    1: 0,
    2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
    4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
    8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
}


def decode(data: bytes | np.ndarray, reduce: int = 1) -> np.ndarray:
    """Decode an encoded image into 8-bit RGB ``[H, W, 3]``.

    EXIF orientation is applied, grayscale expanded to three channels, alpha dropped, 16-bit and
    float images scaled to 8 bits. ``reduce`` (2, 4 or 8) asks the JPEG decoder for a smaller image
    directly, which is much faster for large JPEGs; other formats ignore it.
    """
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if buf.size == 0:
        raise DecodeError("empty file")
    if reduce not in _REDUCED:
        raise ValueError(f"reduce must be 1, 2, 4 or 8, got {reduce}")
    # JPEG is always 8-bit, and asking for ANYDEPTH costs it ~15% (measured); other formats may be
    # 16-bit or float, which ANYDEPTH keeps for to_uint8 to scale properly.
    is_jpeg = buf.size > 2 and buf[0] == 0xFF and buf[1] == 0xD8
    flags = cv2.IMREAD_COLOR_RGB | (0 if is_jpeg else cv2.IMREAD_ANYDEPTH) | _REDUCED[reduce]
    try:
        img = cv2.imdecode(buf, flags)
    except cv2.error as exc:
        raise DecodeError(f"OpenCV cannot decode it ({exc.err})") from None
    if img is None or img.size == 0:
        raise DecodeError("not a decodable image (corrupt, truncated or not an image)")
    if img.ndim == 2:  # some decoders ignore the colour request
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2RGB)
    return to_uint8(img)


def to_uint8(img: np.ndarray) -> np.ndarray:
    """Scale 16-bit (x/257, rounded) or float ([0, 1]) pixels to uint8; uint8 passes through."""
    if img.dtype == np.uint8:
        return img
    if img.dtype == np.uint16:
        return ((img.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if np.issubdtype(img.dtype, np.floating):
        return np.clip(np.nan_to_num(img) * 255.0 + 0.5, 0, 255).astype(np.uint8)
    raise DecodeError(f"unsupported pixel type {img.dtype}")


def interpolation_for(src: tuple[int, int], dst: tuple[int, int]) -> int:
    """INTER_AREA when shrinking (no aliasing), INTER_LINEAR when growing."""
    return cv2.INTER_AREA if dst[0] * dst[1] < src[0] * src[1] else cv2.INTER_LINEAR


def _resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    h, w = img.shape[:2]
    if (h, w) == (height, width):
        return img
    return cv2.resize(img, (width, height), interpolation=interpolation_for((h, w), (height, width)))


def resize_shorter(img: np.ndarray, size: int) -> np.ndarray:
    """Resize so the shorter side is ``size``, keeping the aspect ratio (torchvision's rounding)."""
    h, w = img.shape[:2]
    if h <= w:
        return _resize(img, size, max(1, int(size * w / h)))
    return _resize(img, max(1, int(size * h / w)), size)


def resize_longer(img: np.ndarray, size: int) -> np.ndarray:
    """Resize so the longer side is ``size``, keeping the aspect ratio."""
    h, w = img.shape[:2]
    scale = size / max(h, w)
    return _resize(img, max(1, round(h * scale)), max(1, round(w * scale)))


def center_crop(img: np.ndarray, size: int, pad_value: int = 0) -> np.ndarray:
    """The central ``size`` x ``size`` region; an image smaller than that is padded first."""
    h, w = img.shape[:2]
    if h < size or w < size:
        top, left = max(0, size - h) // 2, max(0, size - w) // 2
        img = cv2.copyMakeBorder(
            img,
            top,
            max(0, size - h) - top,
            left,
            max(0, size - w) - left,
            cv2.BORDER_CONSTANT,
            value=(pad_value,) * 3,
        )
        h, w = img.shape[:2]
    top = int(round((h - size) / 2.0))
    left = int(round((w - size) / 2.0))
    return img[top : top + size, left : left + size]


def letterbox(img: np.ndarray, size: int, pad_value: int = 114) -> tuple[np.ndarray, dict]:
    """YOLO-style letterbox: longer side to ``size``, then pad to ``size`` x ``size`` with ``pad_value``.

    Returns the image and ``{"scale": s, "scale_xy": [sx, sy], "pad": [left, top]}``: ``s`` is the
    nominal ``size / max(h, w)``, ``sx, sy`` what each axis really got once the resized sides were
    rounded to whole pixels (``new_w / w``, ``new_h / h``), so boxes map back exactly with
    ``x_orig = (x - left) / sx``, ``y_orig = (y - top) / sy`` (with ``s``, off by up to ``0.5 / s`` px).
    """
    h, w = img.shape[:2]
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    img = _resize(img, nh, nw)
    top, left = (size - nh) // 2, (size - nw) // 2
    out = cv2.copyMakeBorder(
        img, top, size - nh - top, left, size - nw - left, cv2.BORDER_CONSTANT, value=(pad_value,) * 3
    )
    scale_xy = np.array([nw / w, nh / h], dtype=np.float32)
    return out, {
        "scale": np.float32(scale),
        "scale_xy": scale_xy,
        "pad": np.array([left, top], dtype=np.int32),
    }


# -- batched colour operations on [N, H, W, 3] uint8 ------------------------------------------------


def hflip_batch(images: np.ndarray, flip: np.ndarray) -> np.ndarray:
    """Mirror the images where ``flip`` (bool [N]) is set."""
    out = images.copy()
    out[flip] = images[flip][:, :, ::-1]
    return out


def _factors(factor: np.ndarray | float, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(factor, dtype=np.float32), (n,)).reshape(n, 1, 1, 1)


def _gray(images: np.ndarray) -> np.ndarray:
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    return (images.astype(np.float32) @ weights)[..., None]


def _blend(images: np.ndarray, other: np.ndarray | float, factor: np.ndarray) -> np.ndarray:
    out = images.astype(np.float32) * factor + np.asarray(other, dtype=np.float32) * (1.0 - factor)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def adjust_brightness_batch(images: np.ndarray, factor: np.ndarray | float) -> np.ndarray:
    """Multiply brightness by ``factor`` per image (torchvision semantics), through one LUT each."""
    factors = np.broadcast_to(np.asarray(factor, dtype=np.float32), (len(images),))
    base = np.arange(256, dtype=np.float32)
    out = np.empty_like(images)
    for i, f in enumerate(factors):
        lut = np.clip(base * f + 0.5, 0, 255).astype(np.uint8)
        out[i] = cv2.LUT(images[i], lut)
    return out


def adjust_contrast_batch(images: np.ndarray, factor: np.ndarray | float) -> np.ndarray:
    """Blend each image with its mean gray level by ``factor``."""
    f = _factors(factor, len(images))
    mean = _gray(images).mean(axis=(1, 2, 3), keepdims=True)
    return _blend(images, mean, f)


def adjust_saturation_batch(images: np.ndarray, factor: np.ndarray | float) -> np.ndarray:
    """Blend each image with its own grayscale version by ``factor``."""
    return _blend(images, _gray(images), _factors(factor, len(images)))


def adjust_hue_batch(images: np.ndarray, shift: np.ndarray | float) -> np.ndarray:
    """Rotate hue by ``shift`` (fraction of a turn, in [-0.5, 0.5]) per image, via HSV and a LUT."""
    shifts = np.broadcast_to(np.asarray(shift, dtype=np.float32), (len(images),))
    out = np.empty_like(images)
    base = np.arange(256, dtype=np.int32)
    for i, s in enumerate(shifts):
        hsv = cv2.cvtColor(images[i], cv2.COLOR_RGB2HSV_FULL)
        lut = ((base + int(round(float(s) * 256))) % 256).astype(np.uint8)
        hsv[..., 0] = cv2.LUT(hsv[..., 0], lut)
        out[i] = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB_FULL)
    return out


def normalize_batch(images: np.ndarray, mean, std) -> np.ndarray:
    """uint8 ``[N, C, H, W]`` to float32 ``(x / 255 - mean) / std`` per channel."""
    mean = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    std = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    return (images.astype(np.float32) / 255.0 - mean) / std


def hwc_into_planes(src: np.ndarray, out: np.ndarray) -> None:
    """``src [h, w, C]`` into channels-first ``out [C, h, w]`` (a view: strided rows are fine).

    ``cv2.split`` into the planes is 6x faster than numpy's transposing copy (7 vs 47 us for
    224x224x3); should OpenCV ever hand back new arrays instead of filling ours, numpy copies.
    """
    if src.ndim == 3 and src.shape[2] == out.shape[0] > 1:
        if not src.flags.c_contiguous and not _aligned_planes(out):
            # a window of pixels (strided rows) is copied whole first when the planes are not 32-byte
            # aligned: cv2.split from it into them runs about 15x slower (177 against 12 us for a
            # 224 x 224 crop, the copy included); into aligned planes (a batch row of 224 x 224
            # planes) it splits the window as it is (9 against 15 us with the copy)
            src = _contiguous(src)
        planes = [out[c] for c in range(out.shape[0])]
        if all(a is b for a, b in zip(cv2.split(src, planes), planes)):
            return
    out[...] = src.reshape(src.shape[0], src.shape[1], -1).transpose(2, 0, 1)


def _aligned_planes(out: np.ndarray) -> bool:
    """Whether each plane of ``out [C, h, w]`` is contiguous and starts on a 32-byte boundary."""
    if not out.flags.c_contiguous:
        return False
    start, step = out.ctypes.data, out.strides[0]
    return start % 32 == 0 and step % 32 == 0


def _contiguous(src: np.ndarray) -> np.ndarray:
    """``src`` copied into this thread's reusable contiguous buffer (valid until its next call)."""
    out = scratch(f"ops.contiguous.{src.dtype.str}", src.shape, src.dtype)
    np.copyto(out, src)
    return out


def planes_into_hwc(src: np.ndarray, out: np.ndarray) -> None:
    """Channels-first ``src [C, h, w]`` into channels-last ``out [h, w, C]`` (each row's pixels
    contiguous; rows may be strided, as in a window of a larger image), with ``cv2.merge``: numpy's
    and torch's transposing copies are 5-30x slower (torch's channels-last ``contiguous`` of a uint8
    batch of 640 x 640 samples cost 2.8 ms a sample on one thread, more than its augmentation).
    Should OpenCV ever hand back an array of its own, numpy copies."""
    c = src.shape[0]
    if c > 1 and out.ndim == 3 and out.strides[1:] == (c * out.itemsize, out.itemsize):
        merged = cv2.merge(list(src), out)
        if merged is out:
            return
    out[...] = src.transpose(1, 2, 0)


def planes_as_pixels(src: np.ndarray) -> np.ndarray:
    """Channels-first ``src [C, h, w]`` as a new contiguous channels-last array ``[h, w, C]``."""
    out = np.empty((*src.shape[1:], src.shape[0]), dtype=src.dtype)
    planes_into_hwc(src, out)
    return out
