"""How a build reads sources that are not folders of images: Python datasets, Parquet files, tars."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import UsageError
from ...store.fields import FieldSpec
from ...store.fields.keypoints import flip_pairs, flip_problem
from ...store.limits import short
from .samples import BOX_FORMATS, SampleOptions

__all__ = ["SourceOptions", "recorded_options", "recorded", "with_keypoint_options"]


@dataclass(frozen=True)
class SourceOptions:
    """Options of a source from code or of files of records; ``None`` means "from the source itself"."""

    #: Class names in index order, or a number of classes (default: the dataset's ``.classes``, the
    #: Parquet file's Hugging Face metadata, or the numbers seen in Parquet and tar targets).
    classes: object = None
    #: Boxes given as ``"xyxy"``, ``"xywh"`` (COCO) or ``"cxcywh"`` (YOLO), in pixels or, with
    #: ``normalized``, as fractions of the image's width and height.
    box_format: str = "xyxy"
    normalized: bool = False
    #: A Python dataset's identity: a string (a new one rebuilds everything under ``--update``), or one
    #: id per sample (only the shards whose ids changed are rebuilt). Default: its type and length.
    source_id: object = None
    #: Samples from code: the fields they have besides those their first samples carry (names of
    #: ``label``, ``boxes``, ``labels``, ``mask``, ``text``); a later sample with another is a skip.
    fields: object = None
    #: Iterables, Parquet files and tars: build from the first this-many samples only (None: all).
    max_samples: int | None = None
    #: Parquet columns: the image (``{bytes, path}`` or bytes), the class, the boxes (a struct of
    #: ``bbox`` and ``category`` lists, Hugging Face's ``objects``), a caption.
    image_column: str = "image"
    label_column: str = "label"
    boxes_column: str = "objects"
    text_column: str | None = None
    #: Keypoints: the point each one becomes when the image is mirrored (left and right swapped), as
    #: Ultralytics' ``flip_idx``: K indices (a list, or ``"0,2,1,..."``), each point's partner or
    #: itself. Recorded in the cache, so ``RandomHorizontalFlip`` swaps by it. Any source with
    #: keypoints; for COCO and YOLO it replaces what their point names or data.yaml give.
    flip_idx: object = None
    #: Keypoints: the K points' names (a list, or ``"nose,left_eye,..."``), recorded in the cache
    #: (``preview`` shows them); without ``flip_idx``, ``left_``/``right_`` names pair up as COCO's.
    keypoint_names: object = None

    def limit(self) -> int | None:
        """``max_samples``, checked: a positive integer or None."""
        n = self.max_samples
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise UsageError(f"max_samples={n!r}: give a number of samples of 1 or more")
        return n

    def samples(self) -> SampleOptions:
        if self.box_format not in BOX_FORMATS:
            raise UsageError(f"box_format {self.box_format!r}: choose from {', '.join(BOX_FORMATS)}")
        if self.normalized not in (True, False):  # bool("no") is True: a string would flip every box
            raise UsageError(f"normalized={self.normalized!r}: give True or False")
        return SampleOptions(self.box_format, bool(self.normalized))


def recorded_options(options: SourceOptions, fields: dict, *, columns: bool = True) -> dict:
    """What the manifest's ``source`` records of how a file source was read (to read it again the
    same way: ``cachekit bench``'s raw baseline), beside its layout."""
    out = {}
    if columns:
        out["columns"] = {
            "image_column": options.image_column,
            "label_column": options.label_column,
            "boxes_column": options.boxes_column,
            "text_column": options.text_column,
        }
    if "boxes" in fields:
        out["box_format"] = options.box_format + ("/normalized" if options.normalized else "")
    return out


def recorded(source: dict) -> SourceOptions:
    """The ``SourceOptions`` a manifest's ``source`` records (``recorded_options``); defaults otherwise."""
    columns = source.get("columns") if isinstance(source.get("columns"), dict) else {}
    fmt = str(source.get("box_format", "xyxy"))
    known = {
        k: v
        for k, v in columns.items()
        if k in ("image_column", "label_column", "boxes_column", "text_column")
    }
    return SourceOptions(box_format=fmt.split("/")[0], normalized=fmt.endswith("/normalized"), **known)


def _said(value) -> str:
    """``value`` as an error message shows it: short, on one line (an array as its shape)."""
    if isinstance(value, np.ndarray) and value.ndim != 1:
        return f"an array of shape {list(value.shape)}"
    return " ".join(short(value).split())


def _listed(value, what: str) -> list:
    """A list given as a list (tuple, array) or as comma-separated text."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",")]
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    raise UsageError(f"{what}={_said(value)}: give a list, or the values separated by commas")


def _flip_indices(value) -> list[int]:
    out = []
    for v in _listed(value, "flip_idx"):
        if isinstance(v, str) and v.lstrip("-").isdigit() and v.isascii():
            v = int(v)
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise UsageError(f"flip_idx={_said(value)}: {_said(v)} is not a point index (a whole number)")
        out.append(int(v))
    return out


def with_keypoint_options(fields: dict, options: SourceOptions) -> dict:
    """``fields`` with ``flip_idx=`` and ``keypoint_names=`` written into their keypoints field's
    params (as COCO's and YOLO's sources write theirs), each checked against its ``k``; unchanged
    when neither is given. One line when the source has no keypoints or a value cannot be right."""
    if options.flip_idx is None and options.keypoint_names is None:
        return fields
    given = [
        n
        for n, v in (("flip_idx", options.flip_idx), ("keypoint_names", options.keypoint_names))
        if v is not None
    ]
    points = [name for name, spec in fields.items() if spec.kind == "keypoints"]
    if not points:
        raise UsageError(
            f"{'= and '.join(given)}= {'are' if len(given) > 1 else 'is'} for keypoints, and this source has "
            'none (samples from code give "keypoints" [N, K, 3] beside "boxes", as Parquet and tar targets do)'
        )
    name = points[0]
    params = dict(fields[name].params)
    k = params["k"]
    if options.keypoint_names is not None:
        names = _listed(options.keypoint_names, "keypoint_names")
        if len(names) != k or not all(isinstance(n, str) and n for n in names):
            raise UsageError(
                f"keypoint_names={_said(names)}: give {k} names, one a point (the samples have {k})"
            )
        if len(set(names)) != len(names):
            raise UsageError(f"keypoint_names={_said(names)}: each point needs its own name")
        params["names"] = names
        paired = flip_pairs(names)
        if paired is not None:  # a flip_idx given beside the names replaces it below
            params["flip_idx"] = paired
    if options.flip_idx is not None:
        flip = _flip_indices(options.flip_idx)
        problem = flip_problem(flip, k)
        if problem:
            raise UsageError(f"flip_idx={_said(flip)}: {problem}")
        params["flip_idx"] = flip
    return {**fields, name: FieldSpec("keypoints", params)}
