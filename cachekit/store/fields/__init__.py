"""Typed sample fields besides the image, one kind per module, dispatched by the manifest's ``kind``.

``FieldSpec`` is how the manifest describes a field (``{"kind": "boxes"}``); the kinds say which
columns a shard stores for it and how values go in and come back. See ``docs/FORMAT.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import CacheError
from ..limits import short
from .array import ARRAY_DTYPES, ArrayKind
from .base import Column, ColumnReader, FieldKind, column_name, pack_ragged, ragged_rows
from .boxes import BoxesKind, empty_boxes
from .classes import LabelKind, LabelsKind
from .mask import MaskKind, decode_mask, encode_mask
from .text import TextKind

__all__ = [
    "FIELD_KINDS",
    "FieldSpec",
    "FieldKind",
    "Column",
    "ColumnReader",
    "ARRAY_DTYPES",
    "column_name",
    "pack_ragged",
    "ragged_rows",
    "empty_boxes",
    "encode_mask",
    "decode_mask",
    "field_columns",
    "GEOMETRIC_KINDS",
]

FIELD_KINDS: dict[str, FieldKind] = {
    k.kind: k for k in (LabelKind(), LabelsKind(), BoxesKind(), MaskKind(), TextKind(), ArrayKind())
}
#: Kinds that geometry (crops, flips, resizes, letterbox) moves with the pixels.
GEOMETRIC_KINDS = ("boxes", "mask")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class FieldSpec:
    """One field of a sample: its ``kind`` (a key of ``FIELD_KINDS``) and the kind's parameters."""

    kind: str
    params: dict = field(default_factory=dict)

    @property
    def handler(self) -> FieldKind:
        return FIELD_KINDS[self.kind]

    def columns(self, name: str) -> dict[str, Column]:
        return self.handler.columns(name, self.params)

    def to_json(self) -> dict:
        return {"kind": self.kind, **self.params}

    @classmethod
    def from_json(cls, name: Any, obj: Any, where: str) -> FieldSpec:
        if not isinstance(name, str) or not _NAME.match(name) or "__" in name:
            raise CacheError(f"{where}: bad field name {short(name)}")
        if not isinstance(obj, dict):
            raise CacheError(f"{where}: expected an object, got {short(obj)}")
        kind = obj.get("kind")
        if kind not in FIELD_KINDS:
            raise CacheError(f"{where}.kind: expected one of {', '.join(FIELD_KINDS)}, got {short(kind)}")
        params = {k: v for k, v in obj.items() if k != "kind"}
        return cls(kind, FIELD_KINDS[kind].check_params(params, where))


def field_columns(fields: dict[str, FieldSpec]) -> dict[str, Column]:
    """Every column the fields store, by column name."""
    out: dict[str, Column] = {}
    for name, spec in fields.items():
        out.update(spec.columns(name))
    return out
