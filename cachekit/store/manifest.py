"""The on-disk contract: a versioned ``manifest.json`` describing a cache (``Manifest``), validated.

A cache folder is valid if and only if its manifest validates. This module checks the manifest's
structure from parsed JSON and never touches image data (shard contents are checked by
``cachekit.verify``; the file itself is ``manifestio``'s). Its parts have their own modules, below
this one: what one sample is in ``samplespec``, one shard's entry in ``shardinfo``, a format 5
cache's shards in ``shardtable``; the names the rest of the package imports from here
(``SampleSpec``, ``ArraySpec``, ``ShardInfo``, ``FieldSpec``, ``shard_path``) are re-exported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..constants import MANIFEST_VERSION, READABLE_MANIFEST_VERSIONS, VERSION
from ..errors import CacheError
from ..image.recipes import check_recorded
from .fields import FieldSpec  # re-exported: the public API imports it from here
from .jsonfields import get, get_floats, get_int, get_str
from .limits import MAX_INT, MAX_SAMPLES, MAX_VARIANTS, short
from .samplespec import ArraySpec, SampleSpec  # ArraySpec re-exported
from .shardinfo import ShardInfo, shard_path  # shard_path re-exported: the contract
from .shardtable import indexed_shards

__all__ = [
    "manifest_version_for",
    "FieldSpec",
    "ArraySpec",
    "SampleSpec",
    "ShardInfo",
    "SkippedInput",
    "Manifest",
    "ORDERS",
    "shard_path",
]


def manifest_version_for(sample: SampleSpec) -> int:
    """The format version a new cache is written as: 5 (its shards in the binary index) for every
    sample; 3 and 4 (shards listed in the manifest) are read as before."""
    return MANIFEST_VERSION


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
            raise ValueError("a format 5 manifest is written after its index (store.location.commit_index)")
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
        shards, record = _shards(obj, shards, version, channels, where)
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


def _shards(obj: dict, shards, version: int, channels: int, where: str) -> tuple[Sequence[ShardInfo], dict]:
    """The shards and the index's record: format 5's mapped ``shards`` checked against the
    manifest's counts, or the ``shards`` list of formats 3 and 4; no shard holds more samples than
    its inputs times the pipeline's variants."""
    augment = obj["pipeline"].get("augment") if isinstance(obj.get("pipeline"), dict) else None
    variants = (
        1 if augment is None else get_int(augment, "variants", f"{where}.pipeline.augment", 1, MAX_VARIANTS)
    )
    if version >= 5:
        return indexed_shards(obj, shards, variants, where)
    return _listed(obj, channels, variants, where), {}


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
