"""A batch's targets besides the class: read from the shards, moved with the pixels, and collated.

A sample's target is its class (an int) in a classification cache, and otherwise a dict of its
fields (``cachekit.store.fields``): ``boxes`` (float32 ``[N, 4]`` xyxy) with ``classes`` and
``iscrowd``, ``mask`` (uint8 ``[H, W]``), ``labels`` (int64 class indices), ``text`` (str), ``label``
(int), arrays by their names: read and checked here (``read_values``), carried through a batch's
augmentation as one object (``feed.batchtargets.BatchTargets``: the boxes and keypoints in the one
target carrier, ``image.instances``) and made per-sample dicts at collate.

Batches come as torchvision's detection models take them: a list of per-sample dicts when any
field varies in size from sample to sample (boxes, classes, text), else a dict of stacked tensors
(``{"mask": [B, H, W]}``); ``collate="yolo"`` gives Ultralytics' ``[M, 6]`` rows (image index,
class, cx, cy, w, h, normalised to the image).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..errors import CacheError
from ..store.fields import FieldSpec, decode_mask
from ..store.fields.keypoints import beyond_image

__all__ = [
    "COLLATES",
    "read_values",
    "check_classes",
    "check_labels",
    "sample_target",
    "box_keys",
    "keypoint_fields",
    "collate_targets",
    "yolo_rows",
    "yolo_batch",
    "check_yolo_collate",
    "stacked_fields",
]

#: How ``make_loader`` collates targets: per the fields (``"auto"``), or as Ultralytics' rows.
COLLATES = ("auto", "yolo")

#: What a boxes field stores per box, in ``box_keys`` order.
_BOX_PARTS = ("boxes", "classes", "iscrowd")


def box_keys(name: str) -> tuple[str, str, str]:
    """The target keys of a boxes field: ``boxes``, ``classes``, ``iscrowd`` for the one called
    ``boxes``, else prefixed by its name."""
    if name == "boxes":
        return "boxes", "classes", "iscrowd"
    return name, f"{name}_classes", f"{name}_iscrowd"


def read_values(
    fields: dict[str, FieldSpec],
    column,
    rows: Sequence[int],
    samples: int,
    classes: int | None = None,
    memo: dict | None = None,
    *,
    shape: Sequence | None = None,
) -> list[dict]:
    """The stored values of ``rows`` of one shard, per sample (masks still PNG bytes). Class indices
    are checked against ``classes`` and boxes to be finite with their corners in order (x1 <= x2,
    y1 <= y2): a damaged shard is a CacheError, never a target that indexes past a model's classes,
    a NaN in a loss or a box of negative width. With the cache's sample
    ``shape`` (``[C, H, W]``, or ``[C, None, None]`` when samples keep their own size), boxes are also
    checked to lie inside their image and crowd flags to be 0 or 1.

    ``memo``: a dict kept with the open shard (``CachedDataset`` keeps one per reader). The shard's
    field columns are then read and checked whole, once, and a batch only gathers its rows: the
    checks no longer cost every batch (a detection feed reads a dozen shards a batch).
    """
    check_classes(fields, column, rows, samples, classes, memo, shape=shape)
    per_field = {
        name: spec.handler.unpack(name, spec.params, column, rows, samples, memo)
        for name, spec in fields.items()
    }
    return [{name: values[j] for name, values in per_field.items()} for j in range(len(rows))]


def check_classes(
    fields: dict[str, FieldSpec],
    column,
    rows: Sequence[int],
    samples: int,
    classes: int | None,
    memo: dict | None,
    *,
    shape: Sequence | None = None,
) -> None:
    """Class indices of ``rows`` within ``classes``, boxes finite (and, given the cache's sample
    ``shape``, inside their image, crowd flags 0 or 1), or a CacheError; with a ``memo`` (kept with
    the open shard), every row of the shard, once: a min and max over each column."""
    for name, spec in fields.items():
        if spec.kind == "keypoints":  # its own check (finite, visibility, K) marks ("checked", name)
            if shape is not None and (memo is None or ("inside", name) not in memo):
                every = np.arange(samples) if memo is not None else np.asarray(rows, dtype=np.int64)
                values = spec.handler.unpack(name, spec.params, column, every, samples, memo)
                _check_points_inside(name, values, _image_sizes(column, every, shape))
                if memo is not None:
                    memo[("inside", name)] = True
            continue
        if spec.kind not in ("boxes", "labels") or (memo is not None and ("checked", name) in memo):
            continue
        every = np.arange(samples) if memo is not None else np.asarray(rows, dtype=np.int64)
        values = spec.handler.unpack(name, spec.params, column, every, samples, memo)
        hw = _image_sizes(column, every, shape) if spec.kind == "boxes" else None
        _check_values(name, spec, values, classes, hw)
        if memo is not None:
            memo[("checked", name)] = True


def _check_points_inside(name: str, values: list, hw: np.ndarray) -> None:
    """Every stored point inside its image, within a pixel (a build clips each one onto it), or a
    CacheError: a point a million pixels out would pass as finite into a pose loss."""
    counts = [len(v) for v in values]
    if not sum(counts):
        return
    points = np.concatenate(values)
    size = np.repeat(hw, counts, axis=0)[:, None, :].astype(np.float64)  # (height, width) per object
    out = beyond_image(points, size[..., 0], size[..., 1])
    if out.any():
        x, y = points[..., 0], points[..., 1]
        o, k = (int(v[0]) for v in np.nonzero(out))
        raise CacheError(
            f"field {name!r}: a stored value is out of range (a keypoint ({x[o, k]:g}, {y[o, k]:g}) outside "
            f"its {size[o, 0, 1]:g}x{size[o, 0, 0]:g} image): the shard is damaged"
        )


def check_labels(column, samples: int, classes: int, memo: dict | None) -> None:
    """The shard's ``labels`` column (each sample's class, -1 for none) within ``classes``, or a
    CacheError; once a shard with a ``memo`` (kept with the open shard)."""
    if memo is not None and ("checked", "labels column") in memo:
        return
    labels = np.asarray(column("labels", np.arange(samples, dtype=np.int64)))
    if len(labels) and (labels.min() < -1 or labels.max() >= classes):
        bad = labels[(labels < -1) | (labels >= classes)][0]
        raise CacheError(
            f"a stored class is out of range ({int(bad)}, the cache has {classes} classes): the shard is damaged"
        )
    if memo is not None:
        memo[("checked", "labels column")] = True


def _image_sizes(column, rows: np.ndarray, shape: Sequence | None) -> np.ndarray | None:
    """Each row's stored image ``(height, width)``, from the sample shape or (samples of their own
    size) the shard's ``image_shape`` column; None when the shape is not given."""
    if shape is None:
        return None
    if shape[1] is None:
        # (C, H, W) per row; reshaped to its 3 columns, so that no rows is an empty table, not an error
        return np.asarray(column("image_shape", rows), dtype=np.int64).reshape(len(rows), 3)[:, 1:3]
    return np.tile(np.array(shape[1:3], dtype=np.int64), (len(rows), 1))


def _check_values(
    name: str, spec: FieldSpec, values: list, classes: int | None, hw: np.ndarray | None = None
) -> None:
    if not len(values):
        return
    found = np.concatenate([v["classes"] if spec.kind == "boxes" else v for v in values])
    problem = None
    if bool(len(found)) and classes is not None and (found.min() < 0 or found.max() >= classes):
        problem = f"a class past the {classes} classes"
    elif spec.kind == "boxes":
        boxes = np.concatenate([v["boxes"] for v in values]).reshape(-1, 4)
        crowd = np.concatenate([v["iscrowd"] for v in values])
        inverted = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
        if not np.isfinite(boxes).all():
            problem = "a box that is not finite"
        elif inverted.any():  # x1 == x2 (no area) may be stored; a far corner before the near one not
            j = int(np.flatnonzero(inverted)[0])
            problem = f"a box {boxes[j].tolist()} whose far corner comes before its near one"
        elif len(crowd) and crowd.max() > 1:
            problem = f"an iscrowd flag of {int(crowd.max())}, not 0 or 1"
        elif hw is not None and len(boxes):
            size = np.repeat(hw, [len(v["boxes"]) for v in values], axis=0)  # (height, width) per box
            out = (boxes[:, :2] < -1).any(1) | (boxes[:, 2] > size[:, 1] + 1) | (boxes[:, 3] > size[:, 0] + 1)
            if out.any():
                j = int(np.flatnonzero(out)[0])
                problem = f"a box {boxes[j].tolist()} outside its {size[j, 1]}x{size[j, 0]} image"
    if problem:
        raise CacheError(f"field {name!r}: a stored value is out of range ({problem}): the shard is damaged")


def sample_target(
    fields: dict[str, FieldSpec], values: dict, where: str, hw: tuple[int, int] | None = None
) -> dict:
    """One sample's target dict (numpy arrays) from its stored values, masks decoded (checked to be
    ``hw``, the stored image's size)."""
    out = {}
    for name, spec in fields.items():
        value = values[name]
        if spec.kind == "boxes":
            for key, part in zip(box_keys(name), ("boxes", "classes", "iscrowd")):
                out[key] = value[part]
        elif spec.kind == "mask":
            out[name] = decode_mask(value, where, hw)
        else:
            out[name] = value
    return out


def keypoint_fields(fields: dict[str, FieldSpec], boxes: str) -> list[tuple[str, FieldSpec]]:
    """The keypoints fields whose objects are the boxes of field ``boxes``."""
    return [(n, s) for n, s in fields.items() if s.kind == "keypoints" and s.params["boxes"] == boxes]


def _ragged(fields: dict[str, FieldSpec], fixed_masks: bool) -> bool:
    """Whether a batch's targets differ in size from sample to sample."""
    for spec in fields.values():
        if spec.kind in ("boxes", "keypoints", "labels", "text") or (spec.kind == "mask" and not fixed_masks):
            return True
        if spec.kind == "array" and None in spec.params["shape"]:
            return True
    return False


def _tensor(value):
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    if isinstance(value, (int, np.integer)):
        return torch.tensor(int(value))
    return value  # text


def stacked_fields(fields: dict[str, FieldSpec], fixed_masks: bool) -> bool:
    """True when the batch's targets stack into tensors (no field varies in size)."""
    return not _ragged(fields, fixed_masks)


def collate_targets(
    fields: dict[str, FieldSpec], targets: list[dict], masks: dict[str, torch.Tensor] | None = None
) -> list[dict] | dict:
    """The batch's targets: a list of per-sample dicts of tensors, or a dict of stacked tensors.

    ``masks``: each mask field's batch buffer ``[B, H, W]`` (the per-sample masks are its rows).
    """
    masks = masks or {}
    if not _ragged(fields, fixed_masks=all(name in masks for name, s in fields.items() if s.kind == "mask")):
        out = {}
        for key in targets[0] if targets else ():
            if key in masks:
                out[key] = masks[key]
            else:
                out[key] = torch.as_tensor(np.stack([np.asarray(t[key]) for t in targets]))
        return out
    return [{k: _tensor(v) for k, v in t.items()} for t in targets]


def check_yolo_collate(fields: dict[str, FieldSpec]) -> None:
    """``collate="yolo"`` needs one boxes field, and nothing it would drop: Ultralytics' rows hold
    boxes and their classes only (its ``masks`` are per-object masks, not a cache's class maps)."""
    if not any(spec.kind == "boxes" for spec in fields.values()):
        raise ValueError('collate="yolo" needs a cache with boxes (cachekit build --annotations)')
    others = [
        f"{name} ({spec.kind})"
        for name, spec in fields.items()
        if spec.kind not in ("boxes", "label", "keypoints")
    ]
    if others:
        raise ValueError(
            f'collate="yolo" gives only the boxes, as Ultralytics\' [M, 6] rows; this cache also has '
            f'{", ".join(others)}, which it would drop: use collate="auto" (per-sample dicts with '
            "every field, masks stacked) or a cache built without them"
        )


def yolo_rows(
    fields: dict[str, FieldSpec], targets: list[dict], hw: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """Ultralytics' batch targets: ``[M, 6]`` float32 rows of (image index, class, cx, cy, w, h),
    normalised to each image's height and width ``hw[i]``. Crowd boxes (``iscrowd``) are left out,
    as Ultralytics' and torchvision's training references leave them out."""
    boxes = [name for name, spec in fields.items() if spec.kind == "boxes"]
    if len(boxes) != 1:
        raise ValueError('collate="yolo" needs a cache with one boxes field (--annotations)')
    b, c, k = box_keys(boxes[0])
    rows = []
    for i, (t, (h, w)) in enumerate(zip(targets, hw)):
        keep = np.asarray(t[k]).reshape(-1) == 0 if k in t else slice(None)
        xyxy = np.asarray(t[b], dtype=np.float32).reshape(-1, 4)[keep]
        if not len(xyxy):
            continue
        cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2 / w, (xyxy[:, 1] + xyxy[:, 3]) / 2 / h
        bw, bh = (xyxy[:, 2] - xyxy[:, 0]) / w, (xyxy[:, 3] - xyxy[:, 1]) / h
        rows.append(
            np.stack(
                [np.full(len(xyxy), i, np.float32), np.asarray(t[c], np.float32)[keep], cx, cy, bw, bh], 1
            )
        )
    return torch.from_numpy(np.concatenate(rows).astype(np.float32)) if rows else torch.zeros((0, 6))


def yolo_batch(fields: dict[str, FieldSpec], targets: list[dict], hw: Sequence[tuple[int, int]]):
    """``collate="yolo"``'s targets: ``yolo_rows``, or for a cache with keypoints Ultralytics' pose
    batch: a dict of ``batch_idx`` [M], ``cls`` [M, 1], ``bboxes`` [M, 4] (cx, cy, w, h) and
    ``keypoints`` [M, K, 3] (x, y, visibility), coordinates normalised to each image's width and
    height, crowd boxes left out as ``yolo_rows`` leaves them."""
    rows = yolo_rows(fields, targets, hw)
    points = [(n, s) for n, s in fields.items() if s.kind == "keypoints"]
    if not points:
        return rows
    name, spec = points[0]
    crowd = box_keys(spec.params["boxes"])[2]
    found = []
    for t, (h, w) in zip(targets, hw):
        keep = np.asarray(t[crowd]).reshape(-1) == 0 if crowd in t else slice(None)
        p = np.asarray(t[name], dtype=np.float32).reshape(-1, spec.params["k"], 3)[keep]
        found.append(p / np.array([w, h, 1], np.float32))
    k = spec.params["k"]
    keypoints = np.concatenate(found).astype(np.float32) if found else np.zeros((0, k, 3), np.float32)
    return {
        "batch_idx": rows[:, 0].clone(),
        "cls": rows[:, 1:2].clone(),
        "bboxes": rows[:, 2:6].clone(),
        "keypoints": torch.from_numpy(keypoints.reshape(-1, k, 3)),
    }
