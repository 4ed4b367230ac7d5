"""How a build reads sources that are not folders of images: Python datasets, Parquet files, tars."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .samples import BOX_FORMATS, SampleOptions

__all__ = ["SourceOptions", "recorded_options", "recorded"]


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
