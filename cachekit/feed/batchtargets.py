"""A batch's targets as one object from the read to the collate: ``BatchTargets``.

Each boxes field's objects stay flat, as the shards store them and as the one target carrier
moves them (``image.instances.Instances``: boxes, classes, crowd flags and each keypoints field's
points, owned by the rows of the batch's read, a mosaic's extra rows after the samples); each mask
field's class maps are rows of one ``[B, H, W]`` buffer; the other fields (labels, text, arrays,
the label) are each sample's values as read. Augmentation moves the whole (``BatchWork``); the
per-sample dicts torchvision's detection models take are made once, at collate (``dicts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..image.instances import Instances
from ..store.fields import FieldSpec
from .targets import box_keys, check_classes, keypoint_fields, read_values, sample_target

__all__ = ["BatchTargets", "read_objects", "read_fields"]


@dataclass
class BatchTargets:
    """``objects`` per boxes field (owner: the row of the batch's read); ``masks`` per mask field a
    ``[B, H, W]`` buffer (each sample's map in the top left ``image_hw[j]`` of its row); ``others``
    per sample its other fields' values; ``fields`` the cache's."""

    fields: dict[str, FieldSpec]
    objects: dict[str, Instances]
    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    others: list[dict] = field(default_factory=list)
    image_hw: list[tuple[int, int]] = field(default_factory=list)
    _dicts: list | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.others)

    def __getitem__(self, j: int) -> dict:
        return self.dicts()[j]

    def __iter__(self):
        return iter(self.dicts())

    def dicts(self) -> list[dict]:
        """Each sample's target dict, its keys in the fields' order: a boxes field's boxes, classes
        and iscrowd (tensors, each sample's own), keypoints (a tensor), a mask (its map, at its image's
        size), the other fields as read. Made once, when first asked (at collate)."""
        if self._dicts is None:
            self._dicts = self._make_dicts()
        return self._dicts

    def _make_dicts(self) -> list[dict]:
        n = len(self.others)
        spans = {name: objects.spans(n) for name, objects in self.objects.items()}
        points = {kp: (name, p) for name, objects in self.objects.items() for kp, p, _ in objects.points}
        out = []
        for j in range(n):
            target = {}
            for name, spec in self.fields.items():
                if spec.kind == "boxes":
                    a, b = spans[name][j]
                    o = self.objects[name]
                    for key, part in zip(box_keys(name), (o.boxes, o.classes, o.iscrowd)):
                        target[key] = torch.from_numpy(np.ascontiguousarray(part)[a:b])
                elif spec.kind == "keypoints":
                    owner, p = points[name]
                    a, b = spans[owner][j]
                    target[name] = torch.from_numpy(np.ascontiguousarray(p)[a:b])
                elif spec.kind == "mask":
                    h, w = self.image_hw[j]
                    target[name] = self.masks[name][j].numpy()[:h, :w]
                else:
                    target[name] = self.others[j][name]
            out.append(target)
        return out


def read_objects(fields: dict[str, FieldSpec], groups: list[tuple], classes: int | None, shape) -> dict:
    """Each boxes field's objects of a batch's read, flat in the read's order (each row's as stored),
    with their keypoints fields' points. ``groups``: per shard of the read, ``(positions in the read,
    column reader, rows, samples, memo)``; the values are checked as ``targets.read_values`` checks them."""
    boxes = {name: spec for name, spec in fields.items() if spec.kind == "boxes"}
    if not boxes:
        return {}
    checked = {name: spec for name, spec in fields.items() if spec.kind in ("boxes", "keypoints")}
    for _, column, rows, samples, memo in groups:
        check_classes(checked, column, rows, samples, classes, memo, shape=shape)
    found = {}
    for name, spec in boxes.items():
        owners, parts = [], []
        for pos, column, rows, samples, memo in groups:
            counts, values = spec.handler.gather(name, column, rows, samples, memo)
            owners.append(np.repeat(pos, counts))
            parts.append(values)
        owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
        order = np.argsort(owner, kind="stable")  # the read's order, each row's boxes as stored
        none = {"boxes": np.zeros((0, 4), np.float32), "classes": np.zeros(0, np.int64), "iscrowd": np.zeros(0, np.uint8)}
        flat = [np.concatenate([p[part] for p in parts] or [none[part]])[order] for part in none]
        points = []
        for kp, kspec in keypoint_fields(fields, name):
            got = [kspec.handler.gather(kp, kspec.params, g[1], g[2], g[3], g[4])[1] for g in groups]
            stacked = np.concatenate(got) if got else np.zeros((0, kspec.params["k"], 3), np.float32)
            points.append((kp, stacked[order], kspec.params.get("flip_idx")))
        found[name] = Instances(*flat, owner[order], tuple(points))
    return found


def read_fields(
    fields: dict[str, FieldSpec], kinds: Sequence[str], groups: list[tuple], n: int, classes: int | None, shape
) -> list[dict | None]:
    """The first ``n`` rows' values of the fields of ``kinds`` (a mask still its PNG bytes), per row;
    the other fields left out. ``[None] * n`` when there are none."""
    chosen = {name: spec for name, spec in fields.items() if spec.kind in kinds}
    values: list = [None] * n
    if not chosen:
        return values
    for pos, column, rows, samples, memo in groups:
        keep = pos < n
        if not keep.any():
            continue
        rows = np.asarray(rows, dtype=np.int64)[keep]
        for j, v in zip(pos[keep].tolist(), read_values(chosen, column, rows, samples, classes, memo, shape=shape)):
            values[j] = sample_target(chosen, v, "") if "mask" not in kinds else v
    return values
