"""The on-disk contract: a versioned ``manifest.json`` describing a cache, read, written and validated.

A cache folder is valid if and only if its manifest validates. This module parses and checks the
manifest's structure and never touches image data; shard contents are checked by ``cachekit.verify``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from ..constants import MANIFEST_VERSION, READABLE_MANIFEST_VERSIONS, VERSION
from ..errors import CacheError
from ..image.recipes import check_recorded
from .fields import FieldSpec, field_columns, target_keys
from .jsonfields import dtype_of, get, get_floats, get_int, get_str, itemsize, shape_of
from .limits import (
    MAX_EXTRA_BYTES,
    MAX_EXTRAS,
    MAX_INT,
    MAX_SAMPLE_BYTES,
    MAX_SAMPLES,
    MAX_SHARD_BYTES,
    MAX_SHARD_ROWS,
    MAX_VARIANTS,
    short,
)
from .shardfiles import check_plain_tree, check_shard_name, shard_path  # re-exported: the contract

__all__ = [
    "MANIFEST_VERSION",
    "manifest_version_for",
    "FieldSpec",
    "ArraySpec",
    "SampleSpec",
    "ShardInfo",
    "SkippedInput",
    "Manifest",
    "ORDERS",
    "check_shard_name",
    "check_plain_tree",
    "shard_path",
    "SHARD_NAME_COLUMN",
]

_HEX64 = re.compile(r"^[0-9a-f]{64}$")

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


def manifest_version_for(sample: SampleSpec) -> int:
    """The format version a new cache is written as: 5 (its shards in the binary index) for every
    sample; 3 and 4 (shards listed in the manifest) are read as before."""
    return MANIFEST_VERSION


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: how many samples it holds, how big it is, and what it was built from."""

    file: str
    samples: int
    bytes: int
    sha256: str
    inputs: int
    first: str
    last: str
    inputs_digest: str
    pixel_sum: tuple[float, ...]
    pixel_sumsq: tuple[float, ...]
    pixel_count: int  # pixels per channel the sums cover

    def to_json(self) -> dict:
        out = asdict(self)
        out["pixel_sum"] = list(self.pixel_sum)
        out["pixel_sumsq"] = list(self.pixel_sumsq)
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str, channels: int = 3) -> ShardInfo:
        sha = get_str(obj, "sha256", where)
        digest = get_str(obj, "inputs_digest", where)
        for key, value in (("sha256", sha), ("inputs_digest", digest)):
            if not _HEX64.fullmatch(value):
                raise CacheError(f"{where}.{key}: expected 64 lowercase hex digits, got {value!r}")
        info = cls(
            file=check_shard_name(get(obj, "file", where), f"{where}.file"),
            samples=get_int(obj, "samples", where, maximum=MAX_SHARD_ROWS),
            bytes=get_int(obj, "bytes", where, minimum=1, maximum=MAX_SHARD_BYTES),
            sha256=sha,
            inputs=get_int(obj, "inputs", where, minimum=1, maximum=MAX_SHARD_ROWS),
            first=get_str(obj, "first", where),
            last=get_str(obj, "last", where),
            inputs_digest=digest,
            pixel_sum=get_floats(obj, "pixel_sum", where, channels),
            pixel_sumsq=get_floats(obj, "pixel_sumsq", where, channels),
            pixel_count=get_int(obj, "pixel_count", where),
        )
        return info


@dataclass(frozen=True)
class SkippedInput:
    """A raw input left out of the cache, with the reason (path relative to the raw root).

    ``retry``: the input could not be read (an I/O error, not bad content), so the next build
    tries it again instead of reusing the shard that left it out.
    """

    path: str
    reason: str
    retry: bool = False

    def to_json(self) -> dict:
        out = {"path": self.path, "reason": self.reason}
        if self.retry:
            out["retry"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any, where: str) -> SkippedInput:
        retry = obj.get("retry", False) if isinstance(obj, dict) else False
        if not isinstance(retry, bool):
            raise CacheError(f"{where}.retry: expected true or false, got {retry!r}")
        return cls(path=get_str(obj, "path", where), reason=get_str(obj, "reason", where), retry=retry)


#: Orders a build writes its inputs in (``--order``).
ORDERS = ("shuffled", "sorted")


def _order(obj: Any, where: str) -> dict:
    """The ``order`` object: ``{"kind": "shuffled", "seed": S, "shards": B}`` or ``{"kind": "sorted"}``."""
    kind = get(obj, "kind", where)
    if kind not in ORDERS:
        raise CacheError(f"{where}.kind: expected one of {', '.join(ORDERS)}, got {short(kind)}")
    if kind == "sorted":
        return {"kind": kind}
    seed = get(obj, "seed", where)
    if isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) > MAX_INT:
        raise CacheError(f"{where}.seed: expected an integer, got {short(seed)}")
    return {
        "kind": kind,
        "seed": seed,
        "shards": get_int(obj, "shards", where, minimum=1, maximum=MAX_SAMPLES),
    }


def _limits(obj: Any, where: str) -> dict:
    """The ``limits`` object: ``{"max_pixels": N}`` (0: no limit)."""
    return {"max_pixels": get_int(obj, "max_pixels", where)}


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a cache; the dataset never looks past it for metadata."""

    format: str
    sample: SampleSpec
    shards: Sequence[ShardInfo]  # a tuple, or (format 5, read back) a ``ShardTable`` over the index
    classes: tuple[str, ...]
    pipeline: dict
    fingerprint: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    skipped: tuple[SkippedInput, ...] = ()
    format_options: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    order: dict = field(default_factory=lambda: {"kind": "sorted"})
    limits: dict = field(default_factory=lambda: {"max_pixels": 0})
    created: str = ""
    cachekit_version: str = VERSION
    format_version: int = 0  # 0: the version its samples need (``manifest_version_for``)
    #: Format 5: the index file's record (``store.index.index_record``); empty until it is written.
    index: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.format_version:
            object.__setattr__(self, "format_version", manifest_version_for(self.sample))

    @property
    def num_samples(self) -> int:
        offsets = getattr(self.shards, "offsets", None)
        return int(offsets[-1]) if offsets is not None else sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        sizes = getattr(self.shards, "sizes", None)
        return int(sizes.sum()) if sizes is not None else sum(s.bytes for s in self.shards)

    @property
    def largest_shard(self) -> int:
        """Bytes of the largest shard."""
        sizes = getattr(self.shards, "sizes", None)
        return int(sizes.max()) if sizes is not None else max(s.bytes for s in self.shards)

    @property
    def shard_offsets(self):
        """``offsets[k]``: the global index of shard k's first sample; the last entry, the samples
        (int64; for format 5 a read-only view of the mapped index, shared between processes)."""
        offsets = getattr(self.shards, "offsets", None)
        if offsets is not None:
            return offsets
        counts = np.fromiter((s.samples for s in self.shards), dtype=np.int64, count=len(self.shards))
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def shards_mixed(self) -> bool:
        """True when inputs were spread over the shards in a seeded random order (``--order shuffled``).

        Each shard then holds a sample of every class; a sorted cache's shards follow the folders.
        """
        return self.order.get("kind") == "shuffled"

    def with_shards(self, shards: tuple[ShardInfo, ...]) -> Manifest:
        return replace(self, shards=shards)

    def to_json(self) -> dict:
        return {
            "format_version": self.format_version,
            "cachekit_version": self.cachekit_version,
            "created": self.created,
            "fingerprint": self.fingerprint,
            "format": self.format,
            "format_options": dict(sorted(self.format_options.items())),
            "pipeline": self.pipeline,
            "sample": self.sample.to_json(),
            "num_samples": self.num_samples,
            "classes": list(self.classes),
            "stats": {"mean": list(self.mean), "std": list(self.std)},
            "source": self.source,
            "order": self.order,
            "limits": self.limits,
            "skipped": [s.to_json() for s in self.skipped],
        } | self._shards_json()

    def _shards_json(self) -> dict:
        """Formats 3 and 4 list the shards; format 5 names its index (written first) and its counts."""
        if self.format_version < 5:
            return {"shards": [s.to_json() for s in self.shards]}
        if not self.index:
            raise ValueError(
                "a format 5 manifest is written after its index (store.location.commit_manifest)"
            )
        return {"num_shards": len(self.shards), "total_bytes": self.total_bytes, "index": self.index}

    @classmethod
    def from_json(cls, obj: Any, shards: Sequence[ShardInfo] | None = None) -> Manifest:
        """The manifest ``obj`` describes; format 5's ``shards`` are its mapped index (a
        ``ShardTable``, opened by the caller from ``obj["index"]``), checked against its counts."""
        where = "manifest"
        if not isinstance(obj, dict):
            raise CacheError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        version = get(obj, "format_version", where)
        if isinstance(version, bool) or version not in READABLE_MANIFEST_VERSIONS:
            raise CacheError(
                f"cache format mismatch: code={MANIFEST_VERSION}, file={short(version)}; "
                "rebuild the cache with this version of cachekit"
            )
        sample = SampleSpec.from_json(get(obj, "sample", where))
        if sample.fields and version < 4:
            raise CacheError(f"{where}.sample.fields: a version {version} manifest has no fields")
        channels = sample.shape[0]
        augment = obj["pipeline"].get("augment") if isinstance(obj.get("pipeline"), dict) else None
        variants = (
            1
            if augment is None
            else get_int(augment, "variants", f"{where}.pipeline.augment", 1, MAX_VARIANTS)
        )
        if version >= 5:
            from .shardtable import indexed_shards

            shards, record = indexed_shards(obj, shards, variants, where)
        else:
            shards, record = _listed(obj, channels, variants, where), {}
        pipeline = get(obj, "pipeline", where)
        problem = check_recorded(pipeline)
        if problem:
            raise CacheError(f"{where}.pipeline: {problem}")
        num_samples = get_int(obj, "num_samples", where, maximum=MAX_SAMPLES)
        counted = int(shards.offsets[-1]) if hasattr(shards, "offsets") else sum(s.samples for s in shards)
        if num_samples != counted:
            raise CacheError(f"{where}.num_samples: {num_samples} does not match the shards' total {counted}")
        classes = get(obj, "classes", where)
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise CacheError(f"{where}.classes: expected a list of strings, got {classes!r}")
        stats = get(obj, "stats", where)
        skipped = get(obj, "skipped", where)
        if not isinstance(skipped, list):
            raise CacheError(f"{where}.skipped: expected a list, got {skipped!r}")
        for key in ("pipeline", "format_options", "source"):
            if not isinstance(get(obj, key, where), dict):
                raise CacheError(f"{where}.{key}: expected an object")
        return cls(
            format=get_str(obj, "format", where),
            sample=sample,
            shards=shards,
            classes=tuple(classes),
            pipeline=obj["pipeline"],
            fingerprint=get_str(obj, "fingerprint", where),
            mean=get_floats(stats, "mean", f"{where}.stats", channels),
            std=get_floats(stats, "std", f"{where}.stats", channels),
            skipped=tuple(SkippedInput.from_json(s, f"{where}.skipped[{i}]") for i, s in enumerate(skipped)),
            format_options=obj["format_options"],
            source=obj["source"],
            order=_order(get(obj, "order", where), f"{where}.order"),
            limits=_limits(get(obj, "limits", where), f"{where}.limits"),
            created=get_str(obj, "created", where),
            cachekit_version=get_str(obj, "cachekit_version", where),
            format_version=version,
            index=record,
        )


def _listed(obj: dict, channels: int, variants: int, where: str) -> tuple[ShardInfo, ...]:
    """Formats 3 and 4: the ``shards`` list, every entry validated."""
    shards_obj = get(obj, "shards", where)
    if not isinstance(shards_obj, list) or not shards_obj:
        raise CacheError(f"{where}.shards: expected a non-empty list, got {shards_obj!r}")
    shards = tuple(ShardInfo.from_json(s, f"{where}.shards[{i}]", channels) for i, s in enumerate(shards_obj))
    for i, info in enumerate(shards):
        if info.samples > info.inputs * variants:
            raise CacheError(
                f"{where}.shards[{i}]: {info.samples} samples from only {info.inputs} inputs"
                + (f" x {variants} variants" if variants > 1 else "")
            )
    names = [s.file for s in shards]
    if len(set(names)) != len(names):
        raise CacheError(f"{where}.shards: a shard file is listed twice")
    return shards
