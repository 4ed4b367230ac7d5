"""Variable-length sample storage: encoded images (``--store jpeg|png``), ragged pixels and
channels-last pixels (``--store pixels-hwc``).

Format-independent: a shard stores two columns instead of ``images``: ``image_bytes`` (every
sample's bytes, back to back) and ``image_offsets`` (``N + 1`` int64 boundaries); ragged samples
(each at its own size) and ``pixels-hwc`` samples add ``image_shape`` (``[N, 3]`` int32, channels
first). Any backend stores those like any other column. Bytes are JPEG or PNG files (decoded with
OpenCV), for ragged ``pixels`` the raw ``[C, H, W]`` uint8 array, for ``pixels-hwc`` the raw
``[H, W, C]`` array: the layout OpenCV and torch's channels-last kernels work in, so a crop is
resized straight from the stored rows, with no interleaving of planes first (``ds[i]`` gives it
as a ``[C, H, W]`` array, as it gives a decoded JPEG).
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

from ..errors import CacheError, UsageError
from ..image.ops import hwc_into_planes

__all__ = [
    "STORES",
    "RAW_STORES",
    "shaped_store",
    "encode_images",
    "decode_rows",
    "decode_sample",
    "read_sample",
    "read_raw",
    "check_store",
]

STORES = ("pixels", "pixels-hwc", "jpeg", "png")
#: Stores of raw pixels (read by a memory copy); the others are encoded (decoded on every read).
RAW_STORES = ("pixels", "pixels-hwc")


def check_store(store: str, quality: int) -> None:
    if store not in STORES:
        raise UsageError(f"--store must be one of {', '.join(STORES)}, got {store!r}")
    if store == "jpeg" and not 1 <= quality <= 100:
        raise UsageError(f"--quality must be between 1 and 100, got {quality}")


def shaped_store(store: str) -> bool:
    """True when a shard of ``store`` records every sample's ``image_shape``, fixed-size or not
    (``pixels-hwc`` always: its bytes are read back with it)."""
    return store == "pixels-hwc"


def _params(store: str, quality: int) -> tuple[str, list[int]]:
    if store == "jpeg":
        # 4:4:4 chroma: at the small sizes a cache holds, 4:2:0 costs ~5 dB (33 vs 38.9 dB measured
        # at quality 90 on 224x224 samples) for a third fewer bytes
        return ".jpg", [
            cv2.IMWRITE_JPEG_QUALITY,
            quality,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
        ]
    return ".png", [cv2.IMWRITE_PNG_COMPRESSION, 3]


def encode_images(images, store: str, quality: int = 90) -> tuple[np.ndarray, np.ndarray]:
    """``[C, H, W]`` uint8 RGB images -> (``image_bytes`` uint8 [M], ``image_offsets`` int64 [N + 1])."""
    blobs = []
    for chw in images:
        if store == "pixels":  # ragged pixels: the raw array
            blobs.append(np.ascontiguousarray(chw).reshape(-1))
            continue
        if store == "pixels-hwc":  # the raw array, channels last
            blobs.append(np.ascontiguousarray(chw.transpose(1, 2, 0)).reshape(-1))
            continue
        ext, params = _params(store, quality)
        hwc = chw.transpose(1, 2, 0)
        bgr = np.ascontiguousarray(hwc[..., ::-1] if hwc.shape[2] == 3 else hwc)
        ok, buf = cv2.imencode(ext, bgr, params)
        if not ok:  # pragma: no cover - OpenCV encodes any uint8 image
            raise UsageError(f"OpenCV could not encode a sample as {store}")
        blobs.append(buf.reshape(-1))
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blobs])
    data = np.concatenate(blobs) if blobs else np.zeros(0, dtype=np.uint8)
    return data.astype(np.uint8, copy=False), offsets


def decode_sample(column: Callable[[str, object], np.ndarray], i: int, channels: int = 3) -> np.ndarray:
    """Encoded sample ``i`` decoded to channels-last ``[H, W, C]`` uint8 (OpenCV releases the GIL)."""
    offsets = column("image_offsets", slice(i, i + 2))
    buf = np.asarray(column("image_bytes", slice(int(offsets[0]), int(offsets[1]))))
    img = (
        cv2.imdecode(buf, cv2.IMREAD_COLOR_RGB if channels == 3 else cv2.IMREAD_GRAYSCALE)
        if buf.size
        else None
    )
    if img is None:
        raise CacheError(f"sample {i} of a shard does not decode")
    return img.reshape(img.shape[0], img.shape[1], -1)


def read_sample(
    column: Callable[[str, object], np.ndarray], i: int, store: str, channels: int = 3
) -> np.ndarray:
    """Sample ``i`` of a variable-length shard as a contiguous ``[C, H, W]`` uint8 array of its own:
    the caller may change it in place, the shard's (memory-mapped) bytes never."""
    if store in RAW_STORES:
        pixels = read_raw(column, i, store, channels)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1)) if store == "pixels-hwc" else pixels.copy()
    return np.ascontiguousarray(decode_sample(column, i, channels).transpose(2, 0, 1))


def read_raw(
    column: Callable[[str, object], np.ndarray], i: int, store: str, channels: int | None = None
) -> np.ndarray:
    """Sample ``i`` of a raw pixel store, as stored: ``[C, H, W]`` for ``pixels``, ``[H, W, C]``
    for ``pixels-hwc`` (a view of the shard's bytes: a memory map where the format maps them).
    A recorded shape or offsets that cannot describe the sample (``channels`` other than the
    manifest's, a side below 1, bytes past the shard's) are one ``CacheError``."""
    lo, hi = np.asarray(column("image_offsets", slice(i, i + 2))).tolist()
    shape = np.asarray(column("image_shape", slice(i, i + 1))).reshape(-1).tolist()
    if len(shape) != 3 or min(shape) < 1 or (channels is not None and shape[0] != channels):
        raise CacheError(f"sample {i} records the shape {shape}: the shard is damaged")
    c, h, w = shape
    if c * h * w != hi - lo or lo < 0:
        raise CacheError(f"sample {i} holds {hi - lo} bytes, its shape {[c, h, w]} needs {c * h * w}")
    buf = np.asarray(column("image_bytes", slice(lo, hi)))
    if buf.size != hi - lo:
        raise CacheError(f"sample {i}: its offsets {lo}..{hi} reach past the shard's pixel bytes")
    return buf.reshape(h, w, c) if store == "pixels-hwc" else buf.reshape(c, h, w)


def decode_rows(
    column: Callable[[str, object], np.ndarray], index: np.ndarray, shape: tuple[int, ...]
) -> np.ndarray:
    """Decode rows ``index`` of an encoded shard of fixed-size samples, read through ``column``."""
    out = np.empty((len(index), *shape), dtype=np.uint8)
    for j, i in enumerate(np.asarray(index, dtype=np.int64).tolist()):
        img = decode_sample(column, i, shape[0])  # [H, W, C]
        if (img.shape[2], *img.shape[:2]) != tuple(shape):
            raise CacheError(f"sample {i} decodes to {[img.shape[2], *img.shape[:2]]}, not {list(shape)}")
        hwc_into_planes(img, out[j])
    return out
