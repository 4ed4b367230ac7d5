"""``mask``: a uint8 class map ``[H, W]`` the size of the stored image, kept as a PNG per sample.

PNG is lossless and class maps are mostly runs of one value: a 640x640 map is a few kilobytes
instead of 400, so the column stays small enough to hold in memory with the shard's other columns,
and decoding one (OpenCV, which releases the GIL) costs less than resizing its image.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from ...errors import CacheError
from .base import RaggedKind

__all__ = ["MaskKind", "encode_mask", "decode_mask"]


def encode_mask(mask: np.ndarray) -> np.ndarray:
    """A class map as PNG bytes (fast compression: masks compress well at any level)."""
    ok, buf = cv2.imencode(
        ".png", np.ascontiguousarray(mask, dtype=np.uint8), [cv2.IMWRITE_PNG_COMPRESSION, 1]
    )
    if not ok:  # pragma: no cover - OpenCV encodes any 2-D uint8 array
        raise ValueError("OpenCV could not encode a mask as PNG")
    return buf.reshape(-1)


_PNG = b"\x89PNG\r\n\x1a\n"


def decode_mask(data: np.ndarray, where: str, hw: tuple[int, int] | None = None) -> np.ndarray:
    """PNG bytes back to a uint8 ``[H, W]`` class map of the size ``hw`` its image has; anything else
    is a CacheError. The size is read from the PNG's header before anything is decoded, so a small
    entry declaring a huge image costs nothing."""
    data = np.asarray(data, dtype=np.uint8)
    head = data[:24].tobytes()
    if len(head) < 24 or head[:8] != _PNG or head[12:16] != b"IHDR":
        raise CacheError(f"{where}: a stored mask is not a PNG file")
    width, height = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
    if hw is not None and (height, width) != tuple(int(v) for v in hw):
        raise CacheError(f"{where}: a stored mask is {width}x{height}, its image {hw[1]}x{hw[0]}")
    mask = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
    if mask is None or mask.ndim != 2 or mask.dtype != np.uint8:
        raise CacheError(f"{where}: a stored mask does not decode to a uint8 class map")
    return mask


class MaskKind(RaggedKind):
    """A row comes back as its PNG bytes, decoded by the reader's threads, where the work is."""

    kind = "mask"
    part, dtype = "png", "|u1"

    def check_params(self, params: dict, where: str) -> dict:
        """``classes`` (optional): what each value of the map means, value ``i`` the ``i``-th name."""
        classes = params.get("classes")
        if classes is None:
            return {}
        if (
            not isinstance(classes, list)
            or not 1 <= len(classes) <= 256
            or not all(isinstance(c, str) and 0 < len(c) <= 256 for c in classes)
        ):
            raise CacheError(f"{where}.classes: expected 1 to 256 class names (one per mask value)")
        return {"classes": list(classes)}

    def encode(self, value: Any, params: dict) -> np.ndarray:
        return encode_mask(value)
