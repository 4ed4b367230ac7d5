"""What one stored sample is (``SampleSpec``: a channels-first RGB image, fixed-size extras, typed
fields) and one per-sample array (``ArraySpec``), read from a manifest's ``sample`` object with every
field checked; and the columns every shard reserves, which no extra or field may take."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import CacheError
from .fields import FieldSpec, field_columns, target_keys
from .jsonfields import dtype_of, get, itemsize, shape_of
from .limits import MAX_EXTRA_BYTES, MAX_EXTRAS, MAX_SAMPLE_BYTES, short

__all__ = ["ArraySpec", "SampleSpec", "SHARD_NAME_COLUMN"]

#: The column every shard carries with its own file name (UTF-8 bytes), so that a reader can tell
#: a shard from another one swapped in under its name without hashing it (see formats/base.py).
SHARD_NAME_COLUMN = "shard_name"
#: Columns a shard stores besides the per-sample extras; no extra may take one of these names.
_RESERVED_COLUMNS = {
    "images",
    "labels",
    "image_bytes",
    "image_offsets",
    "image_shape",
    "source_bytes",  # each sample's source path (store/sourcecol.py)
    "source_offsets",
    SHARD_NAME_COLUMN,
}


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one per-sample array (the image, or an extra such as letterbox padding)."""

    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ArraySpec:
        if not isinstance(obj, dict):
            raise CacheError(f"{where}: expected an object, got {short(obj)}")
        dtype = dtype_of(get(obj, "dtype", where), f"{where}.dtype")
        shape = shape_of(get(obj, "shape", where), f"{where}.shape", MAX_EXTRA_BYTES, itemsize(dtype))
        return cls(shape=shape, dtype=dtype)


@dataclass(frozen=True)
class SampleSpec:
    """What one stored sample is: a channels-first RGB image, fixed-size extras, and typed fields
    (a class, several classes, boxes, a mask, text, arrays; none for a classification cache)."""

    shape: tuple[int, ...]
    dtype: str = "|u1"
    extras: dict[str, ArraySpec] = field(default_factory=dict)
    label_dtype: str = "<i8"
    fields: dict[str, FieldSpec] = field(default_factory=dict)

    @property
    def targets(self) -> bool:
        """True when a sample's target is a dict of fields rather than its class alone."""
        return bool(self.fields)

    @property
    def ragged(self) -> bool:
        """True when samples keep their own height and width (``shape`` is ``[C, null, null]``)."""
        return any(d is None for d in self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of one sample; for ragged samples an estimate (a 400x500 image)."""
        c, h, w = self.shape
        return c * (h or 400) * (w or 500)

    def to_json(self) -> dict:
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "layout": "CHW",
            "color": "RGB",
            "label_dtype": self.label_dtype,
            "extras": {k: v.to_json() for k, v in sorted(self.extras.items())},
        } | ({"fields": {k: v.to_json() for k, v in sorted(self.fields.items())}} if self.fields else {})

    @classmethod
    def from_json(cls, obj: Any, where: str = "manifest.sample") -> SampleSpec:
        raw = get(obj, "shape", where)
        if not isinstance(raw, list) or len(raw) != 3 or (raw[1] is None) != (raw[2] is None):
            raise CacheError(f"{where}.shape: expected [channels, height, width], got {raw!r}")
        if raw[1] is None:  # ragged: every sample has its own height and width
            shape = (*shape_of(raw[:1], f"{where}.shape", MAX_SAMPLE_BYTES), None, None)
        else:
            shape = shape_of(raw, f"{where}.shape", MAX_SAMPLE_BYTES)
        if shape[0] not in (1, 3):
            raise CacheError(f"{where}.shape: expected [channels, height, width], got {raw!r}")
        dtype = dtype_of(get(obj, "dtype", where), f"{where}.dtype")
        if dtype != "|u1":
            raise CacheError(f"{where}.dtype: images are stored as '|u1', got {dtype!r}")
        label_dtype = dtype_of(get(obj, "label_dtype", where), f"{where}.label_dtype")
        extras_obj = get(obj, "extras", where)
        if not isinstance(extras_obj, dict) or len(extras_obj) > MAX_EXTRAS:
            raise CacheError(f"{where}.extras: expected an object of at most {MAX_EXTRAS} extras")
        extras = {}
        for name, spec in extras_obj.items():
            if not re.match(r"^[a-z][a-z0-9_]{0,63}$", str(name)) or name in _RESERVED_COLUMNS:
                raise CacheError(f"{where}.extras: bad extra name {name!r}")
            extras[name] = ArraySpec.from_json(spec, f"{where}.extras.{name}")
        fields = _fields(obj.get("fields", {}), f"{where}.fields", set(extras))
        return cls(shape=shape, dtype=dtype, extras=extras, label_dtype=label_dtype, fields=fields)


def _fields(obj: Any, where: str, taken: set[str]) -> dict[str, FieldSpec]:
    """The ``fields`` object, each validated, none of whose columns clash with another column."""
    if not isinstance(obj, dict) or len(obj) > MAX_EXTRAS:
        raise CacheError(f"{where}: expected an object of at most {MAX_EXTRAS} fields")
    fields = {name: FieldSpec.from_json(name, spec, f"{where}.{name}") for name, spec in obj.items()}
    keys = [k for name, spec in fields.items() for k in target_keys(name, spec)]
    if len(set(keys)) != len(keys):
        raise CacheError(
            f"{where}: two fields give a target the same key ({sorted({k for k in keys if keys.count(k) > 1})})"
        )
    for name, spec in fields.items():
        if spec.kind == "keypoints" and getattr(fields.get(spec.params["boxes"]), "kind", None) != "boxes":
            raise CacheError(
                f"{where}.{name}.boxes: {spec.params['boxes']!r} is not a boxes field of this cache"
            )
    columns = list(field_columns(fields))
    clash = (set(columns) & (_RESERVED_COLUMNS | taken)) | {c for c in columns if columns.count(c) > 1}
    if clash:
        raise CacheError(f"{where}: field columns {sorted(clash)} clash with other columns")
    return fields
