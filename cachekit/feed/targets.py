"""A batch's targets besides the class: read from the shards, moved with the pixels, and collated.

A sample's target is its class (an int) in a classification cache, and otherwise a dict of its
fields (``cachekit.store.fields``): ``boxes`` (float32 ``[N, 4]`` xyxy) with ``classes`` and
``iscrowd``, ``mask`` (uint8 ``[H, W]``), ``labels`` (int64 class indices), ``text`` (str), ``label``
(int), arrays by their names. When a batch is augmented, each sample's boxes and mask go through the
very map its pixels went through (``cachekit.image.geometry``): boxes clipped and dropped below
``min_visibility``, masks sampled nearest with 0 outside the image.

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
from ..image.geometry import Affine, move_boxes, move_boxes_batch, warp_mask
from ..store.fields import FieldSpec, decode_mask

__all__ = [
    "COLLATES",
    "read_values",
    "sample_target",
    "move_target",
    "move_boxes_of_batch",
    "box_keys",
    "collate_targets",
    "yolo_rows",
    "stacked_fields",
]

#: How ``make_loader`` collates targets: per the fields (``"auto"``), or as Ultralytics' rows.
COLLATES = ("auto", "yolo")


def box_keys(name: str) -> tuple[str, str, str]:
    """The target keys of a boxes field: ``boxes``, ``classes``, ``iscrowd`` for the one called
    ``boxes``, else prefixed by its name."""
    if name == "boxes":
        return "boxes", "classes", "iscrowd"
    return name, f"{name}_classes", f"{name}_iscrowd"


def read_values(
    fields: dict[str, FieldSpec], column, rows: Sequence[int], samples: int, classes: int | None = None
) -> list[dict]:
    """The stored values of ``rows`` of one shard, per sample (masks still PNG bytes). Class indices
    are checked against ``classes`` and boxes to be finite: a damaged shard is a CacheError, never
    a target that indexes past a model's classes or a NaN in a loss."""
    per_field = {
        name: spec.handler.unpack(name, spec.params, column, rows, samples) for name, spec in fields.items()
    }
    for name, spec in fields.items():
        if spec.kind not in ("boxes", "labels") or not len(rows):
            continue
        values = per_field[name]
        found = np.concatenate([v["classes"] if spec.kind == "boxes" else v for v in values])
        bad = bool(len(found)) and classes is not None and (found.min() < 0 or found.max() >= classes)
        if spec.kind == "boxes" and not np.isfinite(np.concatenate([v["boxes"] for v in values])).all():
            bad = True
        if bad:
            raise CacheError(
                f"field {name!r}: a stored value is out of range (a class past the {classes} classes, or a box "
                "that is not finite): the shard is damaged"
            )
    return [{name: values[j] for name, values in per_field.items()} for j in range(len(rows))]


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


def move_target(
    fields: dict[str, FieldSpec],
    target: dict,
    affine: Affine,
    out_hw: tuple[int, int],
    min_visibility: float,
    mask_out: dict[str, np.ndarray] | None = None,
    boxes: bool = True,
) -> dict:
    """A sample's target after its pixels went through ``affine`` into ``out_hw``; masks are written
    into ``mask_out[name]`` when given (a row of the batch's mask buffer). ``boxes=False`` leaves the
    boxes for ``move_boxes_of_batch``."""
    out = dict(target)
    for name, spec in fields.items():
        if spec.kind == "boxes" and boxes:
            b, c, k = box_keys(name)
            moved = move_boxes(
                {"boxes": target[b], "c": target[c], "k": target[k]}, affine, out_hw, min_visibility
            )
            out[b], out[c], out[k] = moved["boxes"], moved["c"], moved["k"]
        elif spec.kind == "mask":
            dst = mask_out.get(name) if mask_out else None
            out[name] = warp_mask(target[name], affine, out_hw, fill=0, out=dst)
    return out


def move_boxes_of_batch(
    fields: dict[str, FieldSpec], targets: list[dict], maps, out_hw: tuple[int, int], min_visibility: float
) -> None:
    """Every boxes field of a batch's targets through each sample's map, in place, all at once."""
    for name, spec in fields.items():
        if spec.kind != "boxes":
            continue
        b, c, k = box_keys(name)
        moved = move_boxes_batch(
            [{"boxes": t[b], "c": t[c], "k": t[k]} for t in targets], maps, out_hw, min_visibility
        )
        for t, m in zip(targets, moved):
            t[b], t[c], t[k] = m["boxes"], m["c"], m["k"]


def _ragged(fields: dict[str, FieldSpec], fixed_masks: bool) -> bool:
    """Whether a batch's targets differ in size from sample to sample."""
    for spec in fields.values():
        if spec.kind in ("boxes", "labels", "text") or (spec.kind == "mask" and not fixed_masks):
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
