"""An independent OpenCV reference of the built-in pipelines, written from their definitions."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from PIL import Image


def load_rgb(path: Path) -> np.ndarray:
    """Read a file with cv2.imread (no orientation), then apply EXIF orientation by hand."""
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    if img.dtype == np.uint16:
        img = np.round(img / 257.0).astype(np.uint8)
    if img.ndim == 2:
        img = np.dstack([img] * 3)
    img = img[..., :3][..., ::-1]
    orientation = Image.open(path).getexif().get(0x0112, 1) if path.suffix.lower() in (".jpg", ".jpeg") else 1
    rotate = {3: cv2.ROTATE_180, 6: cv2.ROTATE_90_CLOCKWISE, 8: cv2.ROTATE_90_COUNTERCLOCKWISE}
    if orientation in rotate:
        img = cv2.rotate(np.ascontiguousarray(img), rotate[orientation])
    return np.ascontiguousarray(img)


def _resize(img: np.ndarray, h: int, w: int) -> np.ndarray:
    ih, iw = img.shape[:2]
    interp = cv2.INTER_AREA if h * w < ih * iw else cv2.INTER_LINEAR
    return cv2.resize(img, (w, h), interpolation=interp)


def classification(img: np.ndarray, crop: int = 224, resize: int = 256) -> np.ndarray:
    h, w = img.shape[:2]
    if h <= w:
        nh, nw = resize, int(resize * w / h)
    else:
        nh, nw = int(resize * h / w), resize
    img = _resize(img, nh, nw)
    top, left = int(round((nh - crop) / 2)), int(round((nw - crop) / 2))
    return img[top : top + crop, left : left + crop]


def letterbox(img: np.ndarray, size: int = 640, pad: int = 114) -> tuple[np.ndarray, float, int, int]:
    h, w = img.shape[:2]
    s = size / max(h, w)
    nh, nw = round(h * s), round(w * s)
    canvas = np.full((size, size, 3), pad, np.uint8)
    top, left = (size - nh) // 2, (size - nw) // 2
    canvas[top : top + nh, left : left + nw] = _resize(img, nh, nw)
    return canvas, s, left, top


def chw(img: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(img.transpose(2, 0, 1))
