"""The DeiT and YOLO recipes written per sample the fastest way a user could, and their kernels.

Every kernel works on channels-last ``[H, W, 3]`` uint8 pixels, with OpenCV: look-up tables
(``cv2.LUT``) for solarize, autocontrast, equalize and HSV (per channel on the split planes: a
three-channel table costs twice as much), ``cv2.addWeighted`` for brightness and contrast (x *
factor + offset: 25 us on 224 x 224 x 3 against 45 us for ``cv2.LUT`` with this OpenCV) and the
blends (color, sharpness, MixUp), a mask for posterize, one ``warpAffine`` per geometric op, no
float round trips. A sample is turned
into channels-last once (the crop of a cache's planes merged) and back into planes once, at the
end (``cv2.split`` into the output's planes), never by a strided numpy transpose.

The kernels take their parameters; the per-sample transforms (``DeitPerSample``, ``YoloPerSample``)
draw them, and ``recipe_floors.py`` runs the very same kernels on parameters drawn beforehand, with
nothing around them. Magnitudes, tables and fills are cachekit's (torchvision's RandAugment, Ultralytics'
HSV tables and fill 114): ``tests/tools/test_recipe_baselines.py`` checks each op against cachekit's
own kernel on fixed parameters.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from cachekit import CachedDataset
from cachekit.tools.baselines import rrc_params

__all__ = [
    "GRAY",
    "RAND_OPS",
    "rand_magnitude",
    "apply_op",
    "op_matrix",
    "resize_area",
    "resize_antialiased",
    "crop_resize",
    "into_planes",
    "deit_sample",
    "DeitPerSample",
    "mix_batch",
    "MixCollate",
    "hsv_tables",
    "hsv",
    "mosaic_region",
    "mosaic_canvas",
    "canvas_window",
    "window_canvas",
    "yolo_matrix",
    "yolo_pixels",
    "YoloPerSample",
    "yolo_collate",
    "YOLO_FILL",
]

#: ITU-R 601 luma weights, torchvision's colour ops' gray.
GRAY = (0.299, 0.587, 0.114)
#: Ultralytics' grey: the mosaic's canvas and the affine's border.
YOLO_FILL = 114
_LEVELS = np.arange(256, dtype=np.uint8).reshape(1, 256)
_local = threading.local()

#: RandAugment's ops (torchvision's order) -> (magnitude at bin ``m`` of ``bins`` for an h x w image, signed).
RAND_OPS: dict[str, tuple[Callable[[int, int, int, int], float], bool]] = {
    "Identity": (lambda m, bins, h, w: 0.0, False),
    "ShearX": (lambda m, bins, h, w: 0.3 * m / (bins - 1), True),
    "ShearY": (lambda m, bins, h, w: 0.3 * m / (bins - 1), True),
    "TranslateX": (lambda m, bins, h, w: 150.0 / 331.0 * w * m / (bins - 1), True),
    "TranslateY": (lambda m, bins, h, w: 150.0 / 331.0 * h * m / (bins - 1), True),
    "Rotate": (lambda m, bins, h, w: 30.0 * m / (bins - 1), True),
    "Brightness": (lambda m, bins, h, w: 0.9 * m / (bins - 1), True),
    "Color": (lambda m, bins, h, w: 0.9 * m / (bins - 1), True),
    "Contrast": (lambda m, bins, h, w: 0.9 * m / (bins - 1), True),
    "Sharpness": (lambda m, bins, h, w: 0.9 * m / (bins - 1), True),
    "Posterize": (lambda m, bins, h, w: float(round(8 - m / ((bins - 1) / 4))), False),
    "Solarize": (lambda m, bins, h, w: 1.0 - m / (bins - 1), False),
    "AutoContrast": (lambda m, bins, h, w: 0.0, False),
    "Equalize": (lambda m, bins, h, w: 0.0, False),
}
_NAMES = tuple(RAND_OPS)


def rand_magnitude(name: str, magnitude: int, h: int, w: int, negative: bool, bins: int = 31) -> float:
    """torchvision's RandAugment magnitude of op ``name`` at bin ``magnitude``, signed."""
    fn, signed = RAND_OPS[name]
    value = float(np.float32(fn(magnitude, bins, h, w)))  # torchvision's tables are float32
    return -value if signed and negative else value


def op_matrix(name: str, magnitude: float, h: int, w: int) -> np.ndarray:
    """The forward 2x3 map of pixel indices of a geometric op, as torchvision's ``F.affine`` places it
    (shears about the top-left corner, rotations about the centre, counter-clockwise for a positive
    angle, translations truncated to whole pixels)."""
    a, centre, shift = np.eye(2), np.zeros(2), np.zeros(2)
    if name == "ShearX":
        a[0, 1] = -magnitude
    elif name == "ShearY":
        a[1, 0] = -magnitude
    elif name == "TranslateX":
        shift[0] = int(magnitude)
    elif name == "TranslateY":
        shift[1] = int(magnitude)
    else:  # Rotate
        t = math.radians(magnitude)
        a = np.array([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]])
        centre = np.array([w / 2.0, h / 2.0])
    offset = a @ (0.5 - centre) + centre + shift - 0.5
    return np.concatenate([a, offset[:, None]], axis=1)


def _channel_tables(tables: list[np.ndarray]) -> np.ndarray:
    """Three 256-level tables as one three-channel table for ``cv2.LUT``."""
    return np.ascontiguousarray(np.stack([t.reshape(256) for t in tables], axis=1)[None])


def _planes(img: np.ndarray) -> list[np.ndarray]:
    """The pixels' channels split into this thread's reusable planes."""
    planes = [_scratch(f"plane{c}", img.shape[:2]) for c in range(3)]
    cv2.split(img, planes)
    return planes


def _planes_lut(img: np.ndarray, planes: list[np.ndarray], tables: list[np.ndarray]) -> np.ndarray:
    """A table per channel: on the split planes, merged back into ``img`` (a three-channel table on
    the pixels gives the same bytes in twice the time)."""
    for plane, table in zip(planes, tables):
        cv2.LUT(plane, np.ascontiguousarray(np.asarray(table).reshape(256)), dst=plane)
    return cv2.merge(planes, dst=img)


def _equalize_table(hist: np.ndarray) -> np.ndarray:
    last = int(np.flatnonzero(hist)[-1]) if hist.any() else 0
    step = (int(hist.sum()) - int(hist[last])) // 255
    if step == 0:
        return _LEVELS.reshape(256)
    cum = np.cumsum(hist)[:-1]
    return np.concatenate([[0], np.clip((cum + step // 2) // step, 0, 255)]).astype(np.uint8)


def apply_op(img: np.ndarray, name: str, magnitude: float, fill: int = 0) -> np.ndarray:
    """RandAugment's op ``name`` at its signed ``magnitude`` on ``img [H, W, 3]`` uint8 (a new array or
    ``img`` changed in place)."""
    h, w = img.shape[:2]
    if name == "Identity":
        return img
    if name in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"):
        return cv2.warpAffine(img, op_matrix(name, magnitude, h, w), (w, h), flags=cv2.INTER_NEAREST,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 3)  # fmt: skip
    if name in ("Brightness", "Contrast"):  # x * factor + offset: addWeighted (25 us) beats a LUT (45 us)
        offset = 0.0
        if name == "Contrast":
            means = cv2.mean(img)
            offset = -magnitude * sum(g * means[c] for c, g in enumerate(GRAY))
        flat = img.reshape(h, -1)
        cv2.addWeighted(flat, 1.0 + magnitude, flat, 0.0, offset, dst=flat)
        return img
    if name == "Color":
        gray = cv2.cvtColor(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)
        return cv2.addWeighted(img, 1.0 + magnitude, gray, -magnitude, 0.0, dst=img)
    if name == "Sharpness":
        if h <= 2 or w <= 2:
            return img
        smooth = cv2.filter2D(img, -1, _SMOOTH, borderType=cv2.BORDER_REPLICATE)
        inner = img[1:-1, 1:-1]
        cv2.addWeighted(inner, 1.0 + magnitude, smooth[1:-1, 1:-1], -magnitude, 0.0, dst=inner)
        return img
    if name == "Posterize":
        bits = int(magnitude)
        if bits < 8:
            np.bitwise_and(img, np.uint8(((1 << bits) - 1) << (8 - bits)), out=img)
        return img
    if name == "Solarize":
        threshold = 255.0 * magnitude
        table = np.where(_LEVELS >= threshold, 255 - _LEVELS, _LEVELS).astype(np.uint8)
        return cv2.LUT(img, table, dst=img)
    if name == "AutoContrast":
        planes = _planes(img)
        tables = []
        for plane in planes:
            lo, hi = (int(v) for v in cv2.minMaxLoc(plane)[:2])
            if hi == lo:
                tables.append(_LEVELS)
                continue
            scale = np.float32(hi - lo) * np.float32(1.0 / 255.0)
            table = (_LEVELS.astype(np.float32) - np.float32(lo)) / scale
            tables.append(np.clip(table, 0, 255).astype(np.uint8))
        return _planes_lut(img, planes, tables)
    if name == "Equalize":
        planes = _planes(img)
        hists = [cv2.calcHist([p], [0], None, [256], [0, 256]).reshape(-1).astype(np.int64) for p in planes]
        return _planes_lut(img, planes, [_equalize_table(hist) for hist in hists])
    raise ValueError(name)


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32) / 13.0


# -- crops -------------------------------------------------------------------------------------------


def resize_area(hwc: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """OpenCV's resize a user picks: area when shrinking (antialiased), bilinear when enlarging."""
    oh, ow = size
    shrink = hwc.shape[0] > oh or hwc.shape[1] > ow
    return cv2.resize(hwc, (ow, oh), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


def resize_antialiased(hwc: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """cachekit's (torchvision's) resize: torch's antialiased bilinear kernel when shrinking, on
    channels-last pixels; OpenCV's bilinear (the same pixels) when enlarging."""
    oh, ow = size
    if hwc.shape[0] <= oh and hwc.shape[1] <= ow:
        return cv2.resize(hwc, (ow, oh), interpolation=cv2.INTER_LINEAR)
    x = torch.from_numpy(hwc)[None].permute(0, 3, 1, 2)  # [1, C, h, w] seen over channels-last pixels
    return F.interpolate(x, size=(oh, ow), mode="bilinear", antialias=True)[0].permute(1, 2, 0).numpy()


def crop_resize(chw: np.ndarray, box, size: tuple[int, int], resize=resize_area) -> np.ndarray:
    """The crop ``box`` (top, left, h, w) of a sample's planes ``chw``, merged into channels-last pixels
    (only the crop is copied) and resized to ``size``."""
    top, left, h, w = box
    crop = cv2.merge([plane[top : top + h, left : left + w] for plane in chw])
    return resize(crop, size)


def into_planes(hwc: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Channels-last pixels into the planes of ``out [3, H, W]`` (one ``cv2.split``; numpy's copy
    should OpenCV ever hand back arrays of its own)."""
    planes = [out[0], out[1], out[2]]
    if not all(a is b for a, b in zip(cv2.split(hwc, planes), planes)):
        out[...] = hwc.transpose(2, 0, 1)
    return out


# -- DeiT ---------------------------------------------------------------------------------------------


def deit_sample(
    chw: np.ndarray, box, flip: bool, ops, erase, out: np.ndarray, resize=resize_area
) -> np.ndarray:
    """One DeiT sample into ``out [3, size, size]``: crop ``box`` resized, flipped when ``flip``, the
    RandAugment chain ``ops`` ((name, signed magnitude) each), the ``erase`` box (top, left, h, w) set
    to 0 or None."""
    img = crop_resize(chw, box, out.shape[1:], resize)
    if flip:
        img = cv2.flip(img, 1)
    for name, magnitude in ops:
        img = apply_op(img, name, magnitude)
    if erase is not None:
        top, left, h, w = erase
        img[top : top + h, left : left + w] = 0
    return into_planes(img, out)


def draw_erase(size: int, p: float, draw: random.Random) -> tuple[int, int, int, int] | None:
    """torchvision's RandomErasing box (area 2-33%, log-uniform aspect 0.3-3.3, ten attempts), or None."""
    if draw.random() >= p:
        return None
    for _ in range(10):
        area = size * size * draw.uniform(0.02, 0.33)
        ratio = math.exp(draw.uniform(math.log(0.3), math.log(3.3)))
        eh, ew = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
        if eh < size and ew < size:
            return draw.randint(0, size - eh), draw.randint(0, size - ew), eh, ew
    return None


def draw_ops(num_ops: int, magnitude: int, h: int, w: int, draw: random.Random) -> list[tuple[str, float]]:
    """RandAugment's chain: ``num_ops`` ops drawn uniformly, each with a random sign."""
    ops = []
    for _ in range(num_ops):
        name = _NAMES[draw.randrange(len(_NAMES))]
        ops.append((name, rand_magnitude(name, magnitude, h, w, draw.random() < 0.5)))
    return ops


class DeitPerSample:
    """RandomResizedCrop + flip + RandAugment(2, 9) + RandomErasing(0.25, value 0) on one ``[C, H, W]``
    tensor, channels-last inside, drawn from the ``random`` module (seeded per DataLoader worker)."""

    def __init__(self, size: int = 224, num_ops: int = 2, magnitude: int = 9, erase: float = 0.25) -> None:
        self.size, self.num_ops, self.magnitude, self.erase = size, num_ops, magnitude, erase

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        chw = image.numpy()
        s = self.size
        box = rrc_params(chw.shape[1], chw.shape[2])
        flip = random.random() < 0.5
        ops = draw_ops(self.num_ops, self.magnitude, s, s, random)
        out = torch.empty((3, s, s), dtype=torch.uint8)
        deit_sample(chw, box, flip, ops, draw_erase(s, self.erase, random), out.numpy())
        return out


def mix_batch(images: np.ndarray, kind: str, lam: float, box=None) -> float:
    """MixUp (``kind`` "mixup": ``addWeighted`` with the batch rolled by one) or CutMix ("cutmix": the
    ``box`` (y1, y2, x1, x2) of the rolled batch pasted) on ``images [B, C, H, W]`` uint8 in place;
    returns the weight of each sample's own label."""
    n = len(images)
    if kind == "mixup":  # in place, from the last row down: row j - 1 is still its own when j is mixed
        flat = images.reshape(n, -1)
        last = flat[-1].copy()
        for j in range(n - 1, -1, -1):
            partner = flat[j - 1] if j else last
            cv2.addWeighted(flat[j], lam, partner, 1.0 - lam, 0.0, dst=flat[j])
        return lam
    y1, y2, x1, x2 = box
    region = images[:, :, y1:y2, x1:x2]
    region[...] = np.roll(region, 1, axis=0)
    h, w = images.shape[-2:]
    return 1.0 - (y2 - y1) * (x2 - x1) / (h * w)


def draw_mix(h: int, w: int, draw: random.Random) -> tuple[str, float, tuple | None]:
    """One of MixUp (alpha 0.8) or CutMix (alpha 1.0), even odds, torchvision's draws."""
    if draw.random() < 0.5:
        return "mixup", draw.betavariate(0.8, 0.8), None
    lam = draw.betavariate(1.0, 1.0)
    cy, cx = draw.randrange(h), draw.randrange(w)
    rh, rw = int(0.5 * math.sqrt(1.0 - lam) * h), int(0.5 * math.sqrt(1.0 - lam) * w)
    return "cutmix", lam, (max(cy - rh, 0), min(cy + rh, h), max(cx - rw, 0), min(cx + rw, w))


class MixCollate:
    """Stack a batch (uint8), then MixUp or CutMix, one of the two per batch, soft labels."""

    def __init__(self, classes: int) -> None:
        self.classes = classes

    def __call__(self, batch):
        images = torch.stack([b[0] for b in batch])
        labels = torch.nn.functional.one_hot(torch.tensor([b[1] for b in batch]), self.classes).float()
        kind, lam, box = draw_mix(images.shape[-2], images.shape[-1], random)
        lam = mix_batch(images.numpy(), kind, lam, box)
        return images, labels * lam + labels.roll(1, 0) * (1 - lam)


# -- YOLO ---------------------------------------------------------------------------------------------


def hsv_tables(gains) -> np.ndarray:
    """Ultralytics' look-up tables of hue (OpenCV's 0-179), saturation and value for gains ``r``
    (each in [-1, 1] x the hyperparameter), as one three-channel table."""
    x = np.arange(256, dtype=np.float64)
    hue = ((x + gains[0] * 180) % 180).astype(np.uint8)
    sat = np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8)
    val = np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)
    sat[0] = 0
    return _channel_tables([hue, sat, val])


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """This thread's reusable uint8 buffer ``name`` of ``shape`` (a fresh 640 x 640 x 3 array costs its
    page faults every sample)."""
    size = int(np.prod(shape))
    buffer = getattr(_local, name, None)
    if buffer is None or buffer.size < size:
        buffer = np.empty(size, np.uint8)
        setattr(_local, name, buffer)
    return buffer[:size].reshape(shape)


def hsv(img: np.ndarray, gains) -> np.ndarray:
    """Ultralytics' HSV augmentation on RGB pixels in place: to 8-bit HSV, a table per channel (on
    the split planes: one three-channel LUT gives the same bytes in about 1.6x the time), back."""
    h, w = img.shape[:2]
    space = cv2.cvtColor(img, cv2.COLOR_RGB2HSV, dst=_scratch("hsv", (h, w, 3)))
    tables = hsv_tables(gains)[0]
    _planes_lut(space, _planes(space), [tables[:, c] for c in range(3)])
    return cv2.cvtColor(space, cv2.COLOR_HSV2RGB, dst=img)


def _fit(chw: np.ndarray, size: int) -> np.ndarray:
    """A sample's planes as channels-last pixels with the longer side at ``size`` (bilinear)."""
    hwc = cv2.merge(list(chw))
    h, w = hwc.shape[:2]
    r = size / max(h, w)
    if r != 1:
        hwc = cv2.resize(hwc, (round(w * r), round(h * r)), interpolation=cv2.INTER_LINEAR)
    return hwc


def mosaic_region(k: int, w: int, h: int, xc: int, yc: int, size: int) -> tuple[int, ...]:
    """Where tile ``k`` (``w x h`` pixels) lands round ``(xc, yc)`` on the ``2 * size`` canvas:
    ``(x1a, y1a, x2a, y2a)`` on the canvas, ``(x1b, y1b)`` the tile's own first pixel there."""
    s2 = 2 * size
    if k == 0:
        x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
        return x1a, y1a, x2a, y2a, w - (x2a - x1a), h - (y2a - y1a)
    if k == 1:
        x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, s2), yc
        return x1a, y1a, x2a, y2a, 0, h - (y2a - y1a)
    if k == 2:
        x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(s2, yc + h)
        return x1a, y1a, x2a, y2a, w - (x2a - x1a), 0
    return xc, yc, min(xc + w, s2), min(s2, yc + h), 0, 0


def mosaic_canvas(tiles: list[np.ndarray], xc: int, yc: int, size: int) -> tuple[np.ndarray, list]:
    """Ultralytics' ``_mosaic4``: four samples' planes (each brought to the longer side ``size``)
    around ``(xc, yc)`` on a ``2 * size`` canvas of 114; returns the canvas and each tile's (scale,
    dx, dy) for its boxes."""
    s = size
    canvas = _scratch("canvas", (2 * s, 2 * s, 3))
    canvas[...] = YOLO_FILL
    placed = []
    for k, chw in enumerate(tiles):
        img = _fit(chw, s)
        h, w = img.shape[:2]
        x1a, y1a, x2a, y2a, x1b, y1b = mosaic_region(k, w, h, xc, yc, s)
        canvas[y1a:y2a, x1a:x2a] = img[y1b : y1b + y2a - y1a, x1b : x1b + x2a - x1a]
        placed.append((w / chw.shape[2], x1a - x1b, y1a - y1b))
    return canvas, placed


def canvas_window(matrix: np.ndarray, size: int, canvas: int, margin: int = 2) -> tuple[int, int, int, int]:
    """``(x0, y0, x1, y1)``: the part of a ``canvas``-sided canvas a 2x3 forward ``matrix`` onto
    ``size x size`` reads (the output's corners taken back, ``margin`` pixels more for bilinear taps)."""
    inverse = cv2.invertAffineTransform(matrix)
    corners = inverse @ np.array(
        [[0, size - 1, 0, size - 1], [0, 0, size - 1, size - 1], [1, 1, 1, 1]], float
    )
    x0, x1 = (
        int(np.clip(v, 0, canvas))
        for v in (np.floor(corners[0].min()) - margin, np.ceil(corners[0].max()) + margin + 1)
    )
    y0, y1 = (
        int(np.clip(v, 0, canvas))
        for v in (np.floor(corners[1].min()) - margin, np.ceil(corners[1].max()) + margin + 1)
    )
    return (x0, y0, max(x1, x0 + 1), max(y1, y0 + 1))


def window_canvas(tiles: list[np.ndarray], xc: int, yc: int, size: int, window) -> np.ndarray:
    """The window ``(x0, y0, x1, y1)`` of ``mosaic_canvas``'s canvas alone: fill 114, and of each tile
    that reaches into it, the part that does (a tile is resized only when it reaches in)."""
    x0, y0, x1, y1 = window
    out = _scratch("window", (y1 - y0, x1 - x0, 3))
    out[...] = YOLO_FILL
    for k, chw in enumerate(tiles):
        h0, w0 = chw.shape[1:]
        r = size / max(h0, w0)
        h, w = (round(h0 * r), round(w0 * r)) if r != 1 else (h0, w0)
        ax0, ay0, ax1, ay1, bx, by = mosaic_region(k, w, h, xc, yc, size)
        a0, b0, a1, b1 = max(ax0, x0), max(ay0, y0), min(ax1, x1), min(ay1, y1)
        if a1 <= a0 or b1 <= b0:
            continue
        top, left = b0 - ay0 + by, a0 - ax0 + bx
        dst = out[b0 - y0 : b1 - y0, a0 - x0 : a1 - x0]
        if r == 1:  # straight from the planes into the window's pixels
            cv2.merge([plane[top : top + b1 - b0, left : left + a1 - a0] for plane in chw], dst=dst)
        else:
            img = cv2.resize(cv2.merge(list(chw)), (w, h), interpolation=cv2.INTER_LINEAR)
            dst[...] = img[top : top + b1 - b0, left : left + a1 - a0]
    return out


def yolo_matrix(size: int, scale: float, tx: float, ty: float) -> np.ndarray:
    """Ultralytics' ``random_perspective`` without rotation, shear or perspective: the ``2 * size``
    canvas centred, scaled, translated to ``(tx, ty)`` x size; a 2x3 forward map."""
    c = np.eye(3)
    c[0, 2] = c[1, 2] = -size
    m = np.eye(3)
    m[0, 0] = m[1, 1] = scale
    t = np.eye(3)
    t[0, 2], t[1, 2] = tx * size, ty * size
    return (t @ m @ c)[:2]


def yolo_pixels(
    canvas: np.ndarray, matrix: np.ndarray, gains, flip: bool, size: int, out: np.ndarray
) -> np.ndarray:
    """The canvas through ``matrix`` (bilinear, border 114) with the flip folded into it, HSV, into
    ``out [3, size, size]``."""
    if flip:  # x -> size - 1 - x on pixel indices, in the same warp
        matrix = np.array([[-1.0, 0.0, size - 1.0], [0.0, 1.0, 0.0]]) @ np.vstack([matrix, [0, 0, 1]])
    img = cv2.warpAffine(canvas, matrix, (size, size), dst=_scratch("warped", (size, size, 3)), flags=cv2.INTER_LINEAR,
                         borderMode=cv2.BORDER_CONSTANT, borderValue=(YOLO_FILL,) * 3)  # fmt: skip
    return into_planes(hsv(img, gains), out)


def _moved_boxes(
    boxes: np.ndarray, matrix: np.ndarray, scale: float, size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Boxes through ``matrix``: the box round the moved corners, clipped, Ultralytics' candidates kept."""
    corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 2)
    moved = (np.c_[corners, np.ones(len(corners))] @ matrix.T).reshape(-1, 8)
    xs, ys = moved[:, 0::2], moved[:, 1::2]
    new = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1).clip(0, size)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) * scale * scale
    keep = ((new[:, 2] - new[:, 0]) > 2) & ((new[:, 3] - new[:, 1]) > 2)
    keep &= (new[:, 2] - new[:, 0]) * (new[:, 3] - new[:, 1]) > 0.1 * area
    return new, keep


class YoloPerSample(Dataset):
    """Mosaic(640) + RandomAffine (translate 0.1, scale 0.5-1.5, border 114) + HSV(0.015, 0.7, 0.4) +
    flip per sample with the boxes, as Ultralytics' dataset does it, channels-last from the mosaic on,
    reading the cache one sample at a time."""

    def __init__(self, cache: Path, size: int = 640) -> None:
        self.ds, self.size = CachedDataset(cache), size

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        s = self.size
        xc, yc = int(random.uniform(s // 2, 3 * s // 2)), int(random.uniform(s // 2, 3 * s // 2))
        samples = [self.ds[j] for j in [i] + [random.randrange(len(self.ds)) for _ in range(3)]]
        canvas, placed = mosaic_canvas([image.numpy() for image, _ in samples], xc, yc, s)
        boxes = np.concatenate(
            [
                t["boxes"].numpy().astype(np.float32) * r + [dx, dy, dx, dy]
                for (_, t), (r, dx, dy) in zip(samples, placed)
            ]
        )
        classes = np.concatenate([t["classes"].numpy() for _, t in samples])
        scale = random.uniform(0.5, 1.5)
        matrix = yolo_matrix(s, scale, random.uniform(0.4, 0.6), random.uniform(0.4, 0.6))
        gains = [random.uniform(-1, 1) * g for g in (0.015, 0.7, 0.4)]
        flip = random.random() < 0.5
        out = torch.empty((3, s, s), dtype=torch.uint8)
        yolo_pixels(canvas, matrix, gains, flip, s, out.numpy())
        new, keep = _moved_boxes(boxes, matrix, scale, s)
        new, classes = new[keep], classes[keep]
        if flip:
            new = np.stack([s - new[:, 2], new[:, 1], s - new[:, 0], new[:, 3]], 1)
        return out, {"boxes": torch.from_numpy(new.astype(np.float32)), "classes": torch.from_numpy(classes)}


def yolo_collate(batch):
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]
