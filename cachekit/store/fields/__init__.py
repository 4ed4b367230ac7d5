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
from .keypoints import KeypointsKind
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
    "target_keys",
    "check_field_name",
    "GEOMETRIC_KINDS",
]

FIELD_KINDS: dict[str, FieldKind] = {
    k.kind: k
    for k in (LabelKind(), LabelsKind(), BoxesKind(), MaskKind(), TextKind(), ArrayKind(), KeypointsKind())
}
#: Kinds that geometry (crops, flips, resizes, letterbox) moves with the pixels.
GEOMETRIC_KINDS = ("boxes", "mask", "keypoints")
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
        check_field_name(name, set(), where)
        if not isinstance(obj, dict):
            raise CacheError(f"{where}: expected an object, got {short(obj)}")
        kind = obj.get("kind")
        if kind not in FIELD_KINDS:
            raise CacheError(f"{where}.kind: expected one of {', '.join(FIELD_KINDS)}, got {short(kind)}")
        params = {k: v for k, v in obj.items() if k != "kind"}
        return cls(kind, FIELD_KINDS[kind].check_params(params, where))


def target_keys(name: str, spec: FieldSpec) -> tuple[str, ...]:
    """The keys a field gives a sample's target dict: a boxes field three, any other its name."""
    if spec.kind == "boxes":
        return (
            (name, "classes", "iscrowd") if name == "boxes" else (name, f"{name}_classes", f"{name}_iscrowd")
        )
    return (name,)


def check_field_name(name: str, taken: set[str], where: str) -> None:
    """A field name a manifest may hold: lowercase, no ``__``, not a key another field's target uses."""
    if not isinstance(name, str) or not _NAME.match(name) or "__" in name:
        raise CacheError(f"{where}: bad field name {short(name)} (lowercase letters, digits and single _)")
    if name in taken:
        raise CacheError(f"{where}: field name {name!r} is taken by another field or column")


def field_columns(fields: dict[str, FieldSpec]) -> dict[str, Column]:
    """Every column the fields store, by column name."""
    out: dict[str, Column] = {}
    for name, spec in fields.items():
        out.update(spec.columns(name))
    return out
