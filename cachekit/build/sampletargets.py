"""One input's field values in a shard job: read from its raw target, then moved with its pixels.

``raw_values`` turns what discovery recorded (COCO boxes in the image's pixels, YOLO's normalised
rows, a mask file, classes, a caption) into values in the decoded image's pixels, once its size is
known; a target that does not fit its image (another size than the annotations say, a mask of
another size) is a ``DecodeError``: the input is skipped with that reason. ``move_values`` sends
boxes, keypoints and masks through the same maps as the pixels, by the one target carrier
(``cachekit.image.instances``), as read-time augmentation does.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from ..image.geometry import Affine
from ..image.instances import Instances, from_pixel_indices, move_mask
from ..image.ops import DecodeError
from ..store.fields import FieldSpec, empty_boxes
from ..store.fields.keypoints import points_problem

__all__ = ["raw_values", "move_values", "rotated_then", "load_mask", "load_array"]


def load_mask(data: bytes, where: str) -> np.ndarray:
    """A class-map file (grayscale or palette PNG; 16-bit maps of at most 256 classes) as uint8 [H, W].

    PIL reads a palette PNG's indices (the classes, as VOC stores them), where OpenCV would give its
    colours; a colour image is not a class map and is refused.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as img:
            mode = img.mode
            if mode in ("RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV", "LA", "PA"):
                raise DecodeError(
                    f"mask {where} is a {mode} image, not a class map (grayscale or palette PNG)"
                )
            array = np.asarray(img)
    except DecodeError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DecodeError(f"mask {where} does not decode ({' '.join(str(exc).split())[:120]})") from None
    if array.ndim != 2:
        raise DecodeError(f"mask {where} is not a 2-D class map")
    if array.dtype != np.uint8:
        if array.dtype.kind not in "iub" or array.size and (array.min() < 0 or array.max() > 255):
            raise DecodeError(f"mask {where} holds values outside 0-255 (a uint8 class map)")
        array = array.astype(np.uint8)
    return np.ascontiguousarray(array)


#: Pixels a box from code may overhang its image (rounding); more is a box of another image.
_OVERHANG = 1.0


def _corner_boxes(target: dict, h: int, w: int) -> dict:
    """Boxes from code: corners in pixels (``xyxy``) or in [0, 1] (``nxyxy``), clipped to the image."""
    boxes = np.asarray(target["xyxy"] if "xyxy" in target else target["nxyxy"], dtype=np.float64).reshape(
        -1, 4
    )
    if not np.isfinite(boxes).all():
        raise DecodeError("a box that is not a finite number (NaN or infinity)")
    if "nxyxy" in target:
        boxes = boxes * np.array([w, h, w, h], dtype=np.float64)
    slack = _OVERHANG if "xyxy" in target else 1e-3 * max(h, w)
    if len(boxes) and (
        boxes.min() < -slack or (boxes[:, [0, 2]] > w + slack).any() or (boxes[:, [1, 3]] > h + slack).any()
    ):
        raise DecodeError(f"a box outside its {w}x{h} image (is the box format right?)")
    return {
        "boxes": np.clip(boxes, 0, [w, h, w, h]).astype(np.float32),
        "classes": np.asarray(target["classes"], dtype=np.int64).reshape(-1),
        "iscrowd": np.asarray(target["iscrowd"], dtype=np.uint8).reshape(-1),
    }


def _boxes(target: dict, h: int, w: int) -> dict:
    if "xyxy" in target or "nxyxy" in target:
        return _corner_boxes(target, h, w)
    if "size" not in target and "yolo" not in target:
        raise DecodeError("its target has no boxes (the source's other samples have)")
    if "yolo" in target:
        rows = np.asarray(target["yolo"], dtype=np.float64).reshape(-1, 5)
        cx, cy, bw, bh = rows[:, 1] * w, rows[:, 2] * h, rows[:, 3] * w, rows[:, 4] * h
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], axis=1)
        boxes = np.clip(boxes, 0, [w, h, w, h])
        return {"boxes": boxes.astype(np.float32), "classes": rows[:, 0].astype(np.int64),
                "iscrowd": np.zeros(len(rows), dtype=np.uint8)}  # fmt: skip
    ah, aw = target["size"]
    if (ah, aw) != (h, w):
        turned = " (its EXIF orientation turns it)" if (ah, aw) == (w, h) else ""
        raise DecodeError(f"decodes to {w}x{h}, the annotations say {aw}x{ah}{turned}")
    if not target["boxes"]:
        return empty_boxes()
    return {
        "boxes": np.asarray(target["boxes"], dtype=np.float32).reshape(-1, 4),
        "classes": np.asarray(target["classes"], dtype=np.int64),
        "iscrowd": np.asarray(target["iscrowd"], dtype=np.uint8),
    }


def _keypoints(target: dict, spec: FieldSpec, h: int, w: int, boxes: int) -> np.ndarray:
    """An input's keypoints ``[N, K, 3]`` in its pixels (normalised ones scaled), one block per box."""
    k = spec.params["k"]
    found = target.get("keypoints", target.get("nkeypoints"))
    if found is None:
        if boxes:
            raise DecodeError("its boxes have no keypoints (the source's other samples have)")
        return np.zeros((0, k, 3), np.float32)
    points = np.asarray(found, dtype=np.float64)
    if points.size == 0 and points.ndim < 3:  # no objects: [] (a list from Parquet or JSON)
        points = points.reshape(0, k, 3)
    problem = points_problem(points)
    if problem:
        raise DecodeError(problem)
    if points.shape[1] != k:
        raise DecodeError(f"{points.shape[1]} keypoints per object, the dataset's others have {k}")
    if len(points) != boxes:
        raise DecodeError(f"{len(points)} objects of keypoints for {boxes} boxes")
    normalised = "nkeypoints" in target and "keypoints" not in target
    if normalised:
        points = points * np.array([w, h, 1.0])
    # a labelled point outside its image, as a box outside it: another image's, or another format's
    sx, sy = (1e-2 * w, 1e-2 * h) if normalised else (_OVERHANG, _OVERHANG)  # 1%: Ultralytics' bound
    x, y, labelled = points[..., 0], points[..., 1], points[..., 2] > 0
    out = labelled & ((x < -sx) | (y < -sy) | (x > w + sx) | (y > h + sy))
    if out.any():
        o, j = (int(v[0]) for v in np.nonzero(out))
        raise DecodeError(
            f"keypoint {j} of object {o} ({x[o, j]:g}, {y[o, j]:g}) lies outside its {w}x{h} image "
            "(is the keypoint format right?)"
        )
    # past the edge by rounding: onto it, still labelled (unlabelled points are clipped when moved)
    points[..., 0], points[..., 1] = np.where(labelled, x.clip(0, w), x), np.where(labelled, y.clip(0, h), y)
    return points.astype(np.float32)


def load_array(data: bytes | np.ndarray, spec: FieldSpec, where: str) -> np.ndarray:
    """A ``.npy`` file (or an array from code) as the field's dtype, of a shape the field allows
    (nothing pickled is read)."""
    if isinstance(data, np.ndarray):
        array = data
    else:
        try:
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise DecodeError(f"array {where} does not load ({' '.join(str(exc).split())[:120]})") from None
    shape = spec.params["shape"]
    if array.ndim != len(shape) or any(d is not None and d != s for d, s in zip(shape, array.shape)):
        raise DecodeError(f"array {where} is {list(array.shape)}, the field's shape is {shape}")
    if array.dtype.newbyteorder("<").str != spec.params["dtype"] and array.dtype.str != spec.params["dtype"]:
        raise DecodeError(f"array {where} is {array.dtype.str}, the field's dtype is {spec.params['dtype']}")
    return np.ascontiguousarray(array.astype(spec.params["dtype"], copy=False))


def raw_values(
    fields: dict[str, FieldSpec],
    target: dict | None,
    hw: tuple[int, int],
    read_mask: Callable[[str], bytes] | None,
    read_array: dict[str, Callable[[str], bytes]] | None = None,
) -> dict:
    """Each field's value for an input decoded to ``hw``, in its own pixels (``label``: the labels column)."""
    target = target or {}
    h, w = hw
    values = {}
    for name, spec in fields.items():
        if spec.kind == "boxes":
            values[name] = _boxes(target, h, w)
        elif spec.kind == "mask":
            if isinstance(target.get("mask"), np.ndarray):  # from code
                rel, mask = "(from the sample)", target["mask"]
            elif "mask" not in target:
                raise DecodeError("its target has no mask (the source's other samples have)")
            else:
                rel = target["mask"][0]
                mask = load_mask(read_mask(rel), rel)
            if mask.shape != (h, w):
                raise DecodeError(f"its mask {rel} is {mask.shape[1]}x{mask.shape[0]}, the image {w}x{h}")
            values[name] = mask
        elif spec.kind == "labels":
            values[name] = np.asarray(target.get("labels", []), dtype=np.int64)
        elif spec.kind == "keypoints":
            boxes = values.get(spec.params["boxes"]) or _boxes(target, h, w)
            values[name] = _keypoints(target, spec, h, w, len(boxes["boxes"]))
        elif spec.kind == "text":
            values[name] = str(target.get("text", ""))
        elif spec.kind == "array":
            found = target.get("arrays", {}).get(name)
            if found is None:
                raise DecodeError(f"its target has no array {name!r}")
            if isinstance(found, np.ndarray):  # from code
                values[name] = load_array(found, spec, name)
            else:
                values[name] = load_array(read_array[name](found[0]), spec, found[0])
    return values


#: One step of a sample's geometry as its fields take it: a map (an ``Affine``, separable, or a 3x3
#: map of continuous coordinates), the size it leads to, and the share of a box's area it must keep.
Step = tuple  # (Affine | np.ndarray, (height, width), min_visibility)


def move_values(fields: dict[str, FieldSpec], values: dict, steps: list[Step]) -> dict:
    """The values after the pixels went through ``steps`` in order: each boxes field with its
    keypoints fields as one carrier (a box dropped drops its points), masks nearest."""
    out = dict(values)
    for name, spec in fields.items():
        if spec.kind == "boxes":
            points = [(k, s) for k, s in fields.items() if s.kind == "keypoints" and s.params["boxes"] == name]
            moved = _objects(values[name], [(k, values[k], s.params.get("flip_idx")) for k, s in points])
            for where, out_hw, min_visibility in steps:
                matrix = where.as_matrix() if isinstance(where, Affine) else where
                moved = moved.through(matrix, out_hw, min_visibility)
            out[name] = {"boxes": moved.boxes, "classes": moved.classes, "iscrowd": moved.iscrowd}
            out.update({k: p for k, p, _ in moved.points})
        elif spec.kind == "mask":
            mask = values[name]
            for where, out_hw, _ in steps:
                mask = move_mask(mask, where, out_hw)
            out[name] = mask
    return out


def rotated_then(matrix: np.ndarray, size_hw: tuple[int, int], then: Affine, out_hw, min_visibility) -> list[Step]:
    """The steps of a rotation (a ``warpAffine`` map of pixel indices, keeping ``size_hw``) and then
    ``then``: boxes dropped by ``min_visibility`` only at the end, as the pixels are cropped then."""
    return [(from_pixel_indices(matrix), size_hw, 0.0), (then, out_hw, min_visibility)]


def _objects(boxes: dict, points: list) -> Instances:
    n = len(boxes["boxes"])
    return Instances(
        np.asarray(boxes["boxes"], dtype=np.float32).reshape(n, 4),
        np.asarray(boxes["classes"]),
        np.asarray(boxes["iscrowd"]),
        np.zeros(n, np.int64),
        tuple((k, np.asarray(p, dtype=np.float32), flip_idx) for k, p, flip_idx in points),
    )
