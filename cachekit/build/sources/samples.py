"""One sample from code, made a record a shard job can store: its image as HWC uint8 RGB pixels or
encoded bytes, its target in the schema's names (a class, boxes in ``xyxy`` pixels, a mask, ...).

A sample is ``(image, target)`` or a dict (``image`` plus the target's keys). The image may be an
HWC uint8 array (RGB, gray or RGBA: alpha dropped, gray made RGB, as decoding a file does), a CHW
uint8 tensor, a PIL image, encoded bytes, a Hugging Face ``{"bytes", "path"}`` dict, or a path. The
target is an int class, or a dict of ``label``, ``labels``, ``boxes`` + ``classes`` (+ ``iscrowd``),
``mask``, ``text`` and arrays; ``boxes`` with ``labels`` and no ``classes`` is torchvision's naming
(``labels`` are the boxes' classes), and a ``BoundingBoxes``' own format wins over ``box_format``. Whatever does not fit is a ``DecodeError`` saying why: the build skips
that sample with its reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...image.ops import DecodeError
from ...store.fields.keypoints import points_problem
from ...store.limits import MAX_CLASSES, MAX_SAMPLE_BYTES
from .reading import read_input
from .records import Record
from .samplefields import target_fields

__all__ = [
    "SampleOptions",
    "BOX_FORMATS",
    "to_record",
    "json_target",
    "xyxy",
]

BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
#: Target keys with a meaning of their own; any other key is an array field.
_KNOWN = ("label", "labels", "boxes", "classes", "iscrowd", "keypoints", "mask", "text")
#: Largest encoded image or file read for one sample (as ``--max-pixels``' default allows).
_MAX_FILE_BYTES = 1 << 30


@dataclass(frozen=True)
class SampleOptions:
    """How to read samples from code: the boxes' format, and the class names."""

    #: ``"xyxy"``, ``"xywh"`` (COCO) or ``"cxcywh"`` (YOLO), in pixels or, with ``normalized``, in [0, 1].
    box_format: str = "xyxy"
    normalized: bool = False
    #: How many classes the source names, once known (a class at or past it is a skip, not a shard
    #: that every read refuses); None: not known yet (discovery's first samples).
    classes: int | None = None
    #: The fields the cache stores, once known: a sample carrying another is a skip (never stored
    #: without it); None: not known yet.
    fields: frozenset[str] | None = None
    #: ``--classes``' order: the new index of each of the source's classes (None: as they are).
    remap: tuple[int, ...] | None = None


def _check_classes(values: np.ndarray, options: SampleOptions, what: str) -> None:
    """Refuse class indices past the source's names (or past any cache's limit) as a skip."""
    if not len(values):
        return
    top = int(values.max())
    if options.classes is None and top >= MAX_CLASSES:
        raise DecodeError(f"{what} {top} is past the {MAX_CLASSES} classes a cache may name")
    if options.classes is not None and top >= options.classes:
        raise DecodeError(f"{what} {top} is past the {options.classes} classes the source names")


def _is_tensor(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "numpy")


def _pixels(array: np.ndarray, what: str) -> np.ndarray:
    """HWC (or HW) uint8 as HWC uint8 RGB: gray repeated, alpha dropped."""
    if array.dtype != np.uint8:
        raise DecodeError(f"{what} of dtype {array.dtype}: give uint8 pixels (0-255)")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4) or 0 in array.shape:
        raise DecodeError(f"{what} of shape {list(array.shape)}: expected HxW, HxWx1, HxWx3 or HxWx4")
    if (
        array.shape[0] * array.shape[1] * 3 > MAX_SAMPLE_BYTES
    ):  # before a copy (a broadcast view costs nothing)
        raise DecodeError(
            f"{what} of shape {list(array.shape)}: over the {MAX_SAMPLE_BYTES} bytes of RGB a sample may have"
        )
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    return np.ascontiguousarray(array[:, :, :3])


def _read_file(path: str | os.PathLike) -> bytes:
    try:
        return read_input(Path(path), _MAX_FILE_BYTES)
    except OSError as exc:
        raise DecodeError(f"image file {path}: {exc.strerror or exc}") from None


def to_image(image) -> bytes | np.ndarray:
    """A sample's image as encoded bytes or HWC uint8 RGB pixels (``DecodeError`` when it is neither)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, dict):  # Hugging Face's image struct
        if image.get("bytes"):
            return bytes(image["bytes"])
        if image.get("path"):
            return _read_file(image["path"])
        raise DecodeError("image dict without 'bytes' or 'path'")
    if isinstance(image, (str, os.PathLike)):
        return _read_file(image)
    if isinstance(image, np.ndarray):
        return _pixels(image, "image array")
    if _is_tensor(image):
        array = image.detach().cpu().numpy()
        if array.ndim == 3:
            array = array.transpose(1, 2, 0)  # CHW -> HWC
        return _pixels(array, "image tensor")
    if type(image).__module__.split(".")[0] == "PIL":
        if image.mode in ("RGB", "L"):
            return _pixels(np.asarray(image), "PIL image")
        if image.mode == "RGBA":
            return _pixels(np.asarray(image)[:, :, :3], "PIL image")
        return _pixels(np.asarray(image.convert("RGB")), "PIL image")
    raise DecodeError(
        f"image of type {type(image).__name__}: expected an array, tensor, PIL image, bytes or path"
    )


def _array(value, what: str) -> np.ndarray:
    if _is_tensor(value):
        value = value.detach().cpu().numpy()
    elif type(value).__module__.split(".")[0] == "PIL":
        value = np.asarray(value)
    try:
        array = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"{what} is not an array ({exc})") from None
    if array.dtype == object:
        raise DecodeError(f"{what} is not an array of numbers")
    return array


def _int(value, what: str) -> int:
    if _is_tensor(value) or isinstance(value, np.ndarray):
        value = _array(value, what)
        if value.size != 1:
            raise DecodeError(f"{what} of shape {list(value.shape)}: expected one integer")
        value = value.reshape(()).item()
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DecodeError(f"{what} {value!r} is not an integer class")
    if not -1 <= int(value) < MAX_CLASSES:
        raise DecodeError(f"{what} {int(value)} is not a class index (-1 to {MAX_CLASSES - 1})")
    return int(value)


def xyxy(boxes: np.ndarray, fmt: str) -> np.ndarray:
    """``[N, 4]`` boxes of format ``fmt`` as corners ``x1, y1, x2, y2``."""
    b = boxes.astype(np.float64)
    if fmt == "xywh":
        return np.stack([b[:, 0], b[:, 1], b[:, 0] + b[:, 2], b[:, 1] + b[:, 3]], axis=1)
    if fmt == "cxcywh":
        half_w, half_h = b[:, 2] / 2, b[:, 3] / 2
        return np.stack([b[:, 0] - half_w, b[:, 1] - half_h, b[:, 0] + half_w, b[:, 1] + half_h], axis=1)
    return b


def _boxes(target: dict, options: SampleOptions) -> dict:
    boxes = _array(target["boxes"], "boxes")
    if boxes.size == 0:
        boxes = boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise DecodeError(f"boxes of shape {list(boxes.shape)}: expected [N, 4]")
    if not np.isfinite(boxes.astype(np.float64)).all():
        raise DecodeError("a box that is not a finite number (NaN or infinity)")
    classes = _array(target.get("classes", np.zeros(len(boxes), dtype=np.int64)), "classes").reshape(-1)
    crowd = _array(target.get("iscrowd", np.zeros(len(boxes), dtype=np.uint8)), "iscrowd").reshape(-1)
    if len(classes) != len(boxes) or len(crowd) != len(boxes):
        raise DecodeError(f"{len(boxes)} boxes with {len(classes)} classes and {len(crowd)} iscrowd flags")
    if len(classes) and (classes.dtype.kind not in "iub" or classes.min() < 0):
        raise DecodeError("box classes must be integers >= 0")
    _check_classes(classes, options, "box class")
    if len(crowd) and (crowd.dtype.kind not in "iub" or not np.isin(crowd, (0, 1)).all()):
        raise DecodeError("iscrowd flags must be 0 or 1")
    corners = xyxy(boxes, options.box_format)
    if (corners[:, 2] < corners[:, 0]).any() or (corners[:, 3] < corners[:, 1]).any():
        raise DecodeError(
            f"a box whose far corner comes before its near one (is the format {options.box_format}?)"
        )
    key = "nxyxy" if options.normalized else "xyxy"
    return {key: corners, "classes": classes.astype(np.int64), "iscrowd": crowd.astype(np.uint8)}


def _own_format(boxes, options: SampleOptions) -> SampleOptions:
    """A torchvision ``BoundingBoxes``' own format (``XYWH``, ...) over ``box_format``."""
    fmt = getattr(getattr(boxes, "format", None), "name", None)
    if isinstance(fmt, str) and fmt.lower() in BOX_FORMATS:
        return replace(options, box_format=fmt.lower())
    return options


def _target(target, options: SampleOptions) -> tuple[dict, int]:
    """The raw target and class of a sample's target (an int class, or a dict in the schema's names)."""
    if target is None:
        return {}, -1
    if not isinstance(target, dict):
        label = _int(target, "target")
        if label < -1:
            raise DecodeError(f"class {label}: a class is >= 0 (-1: none)")
        _check_classes(np.array([label]), options, "class")
        return {}, label
    out: dict = {}
    label = _int(target["label"], "label") if target.get("label") is not None else -1
    if label < -1:
        raise DecodeError(f"label {label}: a class is >= 0 (-1: none)")
    _check_classes(np.array([label]), options, "label")
    if "boxes" in target and "classes" not in target and "labels" in target:
        target = {**target, "classes": target["labels"]}  # torchvision's name for the boxes' classes
        del target["labels"]
    if "boxes" in target:
        out.update(_boxes(target, _own_format(target["boxes"], options)))
    elif "classes" in target or "iscrowd" in target:
        raise DecodeError("'classes' or 'iscrowd' without 'boxes'")
    if "keypoints" in target:
        if "boxes" not in target:
            raise DecodeError("'keypoints' without 'boxes' (one [K, 3] block of points per box)")
        points = code_keypoints(_array(target["keypoints"], "keypoints"), len(out["classes"]))
        out["nkeypoints" if options.normalized else "keypoints"] = points
    if "labels" in target:
        labels = _array(target["labels"], "labels").reshape(-1)
        if len(labels) and (labels.dtype.kind not in "iub" or labels.min() < 0):
            raise DecodeError("labels must be class indices >= 0")
        _check_classes(labels, options, "a label")
        out["labels"] = labels.astype(np.int64).tolist()
    if "mask" in target:
        mask = _array(target["mask"], "mask")
        if mask.ndim == 3 and 1 in (mask.shape[0], mask.shape[-1]):
            mask = mask.reshape(mask.shape[1:] if mask.shape[0] == 1 else mask.shape[:2])
        if (
            mask.ndim != 2
            or mask.dtype.kind not in "iub"
            or (mask.size and (mask.min() < 0 or mask.max() > 255))
        ):
            raise DecodeError(
                f"mask of shape {list(mask.shape)} and dtype {mask.dtype}: expected an HxW class map of 0-255"
            )
        out["mask"] = np.ascontiguousarray(mask.astype(np.uint8))
    if "text" in target:
        if not isinstance(target["text"], str):
            raise DecodeError(f"text of type {type(target['text']).__name__}: expected a str")
        out["text"] = target["text"]
    arrays = {k: _array(v, f"array {k!r}") for k, v in target.items() if k not in _KNOWN}
    if arrays:
        out["arrays"] = arrays
    return out, label


def to_record(sample, options: SampleOptions = SampleOptions()) -> Record:
    """A sample from code as a ``Record`` (``DecodeError`` saying why when it does not fit)."""
    if isinstance(sample, dict):
        key = next((k for k in ("image", "img", "jpg", "png", "webp") if k in sample), None)
        if key is None:
            raise DecodeError(
                f"a dict sample without an 'image' key (keys: {', '.join(map(str, sample))[:120]})"
            )
        image, target = sample[key], {k: v for k, v in sample.items() if k != key}
    elif isinstance(sample, (tuple, list)) and len(sample) == 2:
        image, target = sample
    else:
        raise DecodeError(f"a sample of type {type(sample).__name__}: expected (image, target) or a dict")
    raw, label = _target(target, options)
    if options.remap is not None:
        raw, label = _remap(raw, label, np.asarray(options.remap, dtype=np.int64))
    if options.fields is not None:
        extra = [name for name in target_fields(raw) if name not in options.fields]
        if extra:
            raise DecodeError(
                f"its target has {', '.join(extra)}, a field the cache does not store (its fields come from "
                "the first samples: declare them with fields=[...])"
            )
        if "boxes" in options.fields and "xyxy" not in raw and "nxyxy" not in raw:  # no boxes: none
            raw.update(xyxy=np.zeros((0, 4)), classes=np.zeros(0, np.int64), iscrowd=np.zeros(0, np.uint8))
    return Record(to_image(image), raw, label)


def code_keypoints(points: np.ndarray, boxes: int) -> np.ndarray:
    """Points from code, ``[N, K, 3]`` (x, y, visibility 0/1/2) or ``[N, K, 2]`` (visible), one block
    per box, as float64 ``[N, K, 3]``; anything else is a ``DecodeError`` saying why."""
    if points.ndim < 3 and points.size == 0:  # no objects: [] (a list from Parquet or JSON)
        points = points.reshape(0, 0, 3)
    if points.ndim != 3 or points.shape[2] not in (2, 3) or points.dtype.kind not in "iuf":
        raise DecodeError(f"keypoints of shape {list(points.shape)}: expected [N, K, 3] or [N, K, 2]")
    if len(points) != boxes:
        raise DecodeError(f"{len(points)} objects of keypoints for {boxes} boxes (one block per box)")
    points = points.astype(np.float64)
    if points.shape[2] == 2:
        points = np.concatenate([points, np.full((*points.shape[:2], 1), 2.0)], axis=2)
    problem = points_problem(points)
    if problem:
        raise DecodeError(problem)
    return points


def _remap(raw: dict, label: int, remap: np.ndarray) -> tuple[dict, int]:
    """A record's class indices in ``--classes``' order (its class, its boxes', its labels)."""
    if "classes" in raw:
        raw["classes"] = remap[raw["classes"]]
    if "labels" in raw:
        raw["labels"] = sorted(int(c) for c in remap[np.asarray(raw["labels"], dtype=np.int64)])
    return raw, int(remap[label]) if label >= 0 else label


def json_target(target, options: SampleOptions) -> tuple[dict, int]:
    """A target read at discovery (Parquet columns, a tar's ``.cls``/``.json``) as JSON-able raw
    target and class: it travels with its input and is part of its digest."""
    raw, label = _target(target, options)
    if "mask" in raw or "arrays" in raw:
        raise DecodeError("masks and arrays are read from code samples only")
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in raw.items()}, label
