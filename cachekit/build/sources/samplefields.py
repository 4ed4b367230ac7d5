"""The fields of samples, learnt before any is stored: from a few first records of code (their
targets' keys, ``fields=``' declared names) or from targets read at discovery (Parquet columns, a
tar's ``.cls``/``.json``), and how many classes their indices need."""

from __future__ import annotations

import numpy as np

from ...image.ops import DecodeError
from ...store.fields import ARRAY_DTYPES, FieldSpec
from .records import Record

__all__ = ["target_fields", "DECLARABLE", "fields_of", "fields_of_targets", "keypoints_spec", "classes_seen"]


def target_fields(raw: dict) -> list[str]:
    """The fields a raw target carries (besides its class)."""
    names = ["boxes"] if "xyxy" in raw or "nxyxy" in raw else []
    names += ["keypoints"] if "keypoints" in raw or "nkeypoints" in raw else []
    names += [key for key in ("labels", "mask", "text") if key in raw]
    return names + list(raw.get("arrays", {}))


#: The fields ``fields=`` may declare for samples from code (an array field is learnt from a sample).
DECLARABLE = ("label", "boxes", "labels", "mask", "text")


def fields_of(records: list[Record], declared=()) -> dict[str, FieldSpec]:
    """The fields of samples like ``records`` (a few first ones): those any of their targets carries,
    and those ``declared`` (names of ``DECLARABLE``)."""
    carried = {name for r in records for name in target_fields(r.target)}
    fields: dict[str, FieldSpec] = {}
    if "label" in declared or (any(r.target for r in records) and any(r.label >= 0 for r in records)):
        fields["label"] = FieldSpec("label")
    for key in ("boxes", "labels", "mask", "text"):
        if key in carried or key in declared:
            fields[key] = FieldSpec(key)
    if "keypoints" in carried and "boxes" in fields:
        fields["keypoints"] = keypoints_spec([r.target for r in records])
    arrays: dict[str, np.ndarray] = {}
    for r in records:
        for name, array in r.target.get("arrays", {}).items():
            arrays.setdefault(name, array)
    for name, array in arrays.items():
        dtype = array.dtype.newbyteorder("<").str if array.dtype.itemsize > 1 else array.dtype.str
        if dtype not in ARRAY_DTYPES:
            raise DecodeError(
                f"array {name!r} of dtype {array.dtype}: an array field takes {', '.join(ARRAY_DTYPES)}"
            )
        shapes = [r.target.get("arrays", {}).get(name, array).shape for r in records]
        same = all(len(s) == array.ndim for s in shapes)
        shape = [d if same and all(s[k] == d for s in shapes) else None for k, d in enumerate(array.shape)]
        fields[name] = FieldSpec("array", {"dtype": dtype, "shape": shape})
    return fields


def fields_of_targets(targets: list[dict], labels: np.ndarray) -> dict[str, FieldSpec]:
    """The fields of targets read at discovery: boxes, labels, text, and the class beside them."""
    fields: dict[str, FieldSpec] = {}
    kinds = {k for t in targets for k in t}
    if "xyxy" in kinds or "nxyxy" in kinds:
        fields["boxes"] = FieldSpec("boxes")
        if "keypoints" in kinds or "nkeypoints" in kinds:
            fields["keypoints"] = keypoints_spec(targets)
    for key in ("labels", "text"):
        if key in kinds:
            fields[key] = FieldSpec(key)
    if fields and (labels >= 0).any():
        fields = {"label": FieldSpec("label"), **fields}
    return fields


def keypoints_spec(targets: list[dict]) -> FieldSpec:
    """The keypoints field of raw targets like ``targets``: ``K`` from the first that has points
    (a target of another ``K`` is skipped when its shard is built, with that reason)."""
    k = 1
    for t in targets:
        points = np.asarray(t.get("keypoints", t.get("nkeypoints", [])))
        if points.ndim == 3 and points.shape[1]:
            k = int(points.shape[1])
            break
    return FieldSpec("keypoints", {"boxes": "boxes", "k": k})


def classes_seen(targets: list[dict], labels: np.ndarray) -> int:
    """How many classes the targets' indices need (the largest seen, plus one)."""
    top = int(labels.max()) if len(labels) else -1
    for t in targets:
        for key in ("classes", "labels"):
            if t.get(key):
                top = max(top, max(t[key]))
    return top + 1
