"""What a build will write: the fingerprint of its options, each shard's inputs and name, and what
changed since the cache in ``--out`` was built.

A shard's name is a hash of everything its bytes depend on: the content options (recipe, size,
format, codec, store, quality, seed, augmentation, fast decode, input limits, format version,
classes) and its own inputs (paths, sizes, mtimes, labels, in order). So a file that exists under
a planned name *is* that shard, and reuse (resume, ``--update``) can never mix options: change any
of them and every name changes. The cache's fingerprint adds the layout and all inputs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

import numpy as np

from ..constants import DEFAULT_SHARD_BYTES, MAX_SHARD_SAMPLES, MIN_SHARD_SAMPLES
from ..store.manifest import Manifest
from .inputorder import default_shards, shard_rows
from .sources import Source

__all__ = [
    "Content",
    "PlannedShard",
    "plan",
    "layout",
    "cache_fingerprint",
    "option_changes",
    "default_shard_size",
    "sha_json",
]

#: Small datasets get at least this many shards so every worker has work to balance.
_MIN_SHARDS = 16


def sha_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Content:
    """The options a shard's bytes depend on, as recorded in the manifest."""

    pipeline: dict  # the resolved recipe, with fast_decode and augment
    format: str
    options: dict  # compression, store, quality
    sample: dict
    classes: tuple[str, ...]
    limits: dict

    def fingerprint(self) -> str:
        return sha_json(
            {
                "format_version": 4 if self.sample.get("fields") else 3,  # manifest_version_for
                "pipeline": self.pipeline,
                "format": self.format,
                "options": self.options,
                "sample": self.sample,
                "classes": list(self.classes),
                "limits": self.limits,
            }
        )


@dataclass(frozen=True)
class PlannedShard:
    rows: np.ndarray  # input rows of the Source, in the shard's order
    digest: str  # Source.digest(rows)
    name: str


def plan(source: Source, order: dict, shard_size: int, content_fp: str, extension: str) -> list[PlannedShard]:
    """The shards of a build, in manifest order, each named by its content."""
    shards = []
    for rows in shard_rows(source, order, shard_size):
        digest = source.digest(rows)
        name = hashlib.sha256(f"{content_fp}{digest}".encode()).hexdigest()[:20]
        shards.append(PlannedShard(rows, digest, f"shard-{name}{extension}"))
    return shards


def cache_fingerprint(content_fp: str, order: dict, shard_size: int, source: Source) -> str:
    """Same inputs, options and layout <=> same fingerprint <=> "up to date"."""
    layout = sha_json({"order": order, "shard_size": shard_size})
    return hashlib.sha256(f"{content_fp}\n{layout}\n{source.digest()}".encode()).hexdigest()


def _pipeline_changes(old: dict, new: dict) -> list[str]:
    out = []
    if old.get("name") != new.get("name"):
        out.append(f"recipe {old.get('name')} -> {new.get('name')}")
    elif old.get("size") != new.get("size"):
        out.append(f"size {old.get('size')} -> {new.get('size')}")
    elif old.get("steps") != new.get("steps"):
        out.append(f"recipe {new.get('name')}'s steps")
    if bool(old.get("fast_decode")) != bool(new.get("fast_decode")):
        out.append(
            f"fast-decode {'on' if old.get('fast_decode') else 'off'} -> {'on' if new.get('fast_decode') else 'off'}"
        )
    if old.get("min_visibility") != new.get("min_visibility"):
        out.append(f"min-visibility {old.get('min_visibility')} -> {new.get('min_visibility')}")
    a, b = old.get("augment") or {}, new.get("augment") or {}
    if a.get("variants", 0) != b.get("variants", 0):
        out.append(f"augment {a.get('variants', 0)} -> {b.get('variants', 0)}")
    elif {k: v for k, v in a.items() if k != "seed"} != {k: v for k, v in b.items() if k != "seed"}:
        out.append("augmentation settings")
    return out


def option_changes(
    previous: Manifest, content: Content, order: dict, shard_size: int, seed: int | None
) -> list[str]:
    """What differs between the options ``previous`` was built with and this build's, in words."""
    out = _pipeline_changes(previous.pipeline, content.pipeline)
    if previous.format != content.format:
        out.append(f"format {previous.format} -> {content.format}")
    old_opts = previous.format_options
    for key, default in (("compression", "none"), ("store", "pixels"), ("quality", None)):
        a, b = old_opts.get(key, default), content.options.get(key, default)
        if a != b:
            out.append(f"{key} {a} -> {b}")
    old_order = previous.order
    if old_order.get("kind") != order["kind"]:
        out.append(f"order {old_order.get('kind')} -> {order['kind']}")
    else:
        if order["kind"] == "shuffled" and old_order.get("shards") != order["shards"]:
            out.append(f"shards {old_order.get('shards')} -> {order['shards']}")
        if order["kind"] == "sorted" and old_opts.get("shard_size") != shard_size:
            out.append(f"shard size {old_opts.get('shard_size')} -> {shard_size}")
    old_seed = old_order.get("seed", (previous.pipeline.get("augment") or {}).get("seed"))
    if seed is not None and old_seed is not None and old_seed != seed:
        out.append(f"seed {old_seed} -> {seed}")
    if previous.limits != content.limits:
        out.append(f"max-pixels {previous.limits.get('max_pixels')} -> {content.limits.get('max_pixels')}")
    old_fields = sorted(previous.sample.to_json().get("fields", {}))
    new_fields = sorted(content.sample.get("fields", {}))
    if old_fields != new_fields:
        out.append(f"fields {', '.join(old_fields) or 'none'} -> {', '.join(new_fields) or 'none'}")
    if tuple(previous.classes) != tuple(content.classes):
        out.append("classes (their names or order)")
    if not out and previous.sample.to_json() != content.sample:
        out.append("sample layout")
    return out


def default_shard_size(sample_bytes: int, inputs: int, target_bytes: int = DEFAULT_SHARD_BYTES) -> int:
    """About ``target_bytes`` of pixels per shard (``DEFAULT_SHARD_BYTES``, or
    ``DEFAULT_REMOTE_SHARD_BYTES`` for object storage), fewer for small datasets so work spreads out."""
    by_bytes = max(MIN_SHARD_SAMPLES, target_bytes // max(1, sample_bytes))
    balanced = max(MIN_SHARD_SAMPLES, math.ceil(inputs / _MIN_SHARDS))
    return min(by_bytes, balanced, MAX_SHARD_SAMPLES)


def layout(
    source: Source,
    sample_bytes: int,
    requested: dict,
    old: dict | None,
    target_bytes: int = DEFAULT_SHARD_BYTES,
) -> tuple[dict, int]:
    """The order and shard size of a build.

    ``requested`` holds the build's ``order``, ``seed``, ``shard_size`` and ``shards`` (None: not
    given). ``old`` is the layout to keep, ``{"order": ..., "shard_size": ...}`` of the cache in
    ``--out`` (or of an unfinished build there), None for a fresh cut: it fills in what was not
    given (its shard size; its number of shards when shuffled, unless another shard size is asked
    for), so that a changed input touches one shard and a re-run is "up to date". A fresh cut
    takes ``shards`` = inputs / shard size. ``target_bytes``: the bytes of a shard when no size is
    given or kept (``default_shard_size``).
    """
    old = old or {}
    old_size = old.get("shard_size")
    if requested["shard_size"] is not None:
        shard_size = requested["shard_size"]
    elif isinstance(old_size, int) and not isinstance(old_size, bool) and 1 <= old_size <= MAX_SHARD_SAMPLES:
        shard_size = old_size
    else:
        shard_size = default_shard_size(sample_bytes, len(source), target_bytes)
    if requested["order"] == "sorted":
        return {"kind": "sorted"}, shard_size
    shards = requested["shards"]
    old_order = old.get("order") if isinstance(old.get("order"), dict) else {}
    kept = old_order.get("shards")
    if (
        shards is None
        and requested["shard_size"] in (None, old_size)
        and old_order.get("kind") == "shuffled"
        and isinstance(kept, int)
        and not isinstance(kept, bool)
        and kept >= 1
    ):
        shards = kept
    order = {
        "kind": "shuffled",
        "seed": requested["seed"],
        "shards": shards or default_shards(len(source), shard_size),
    }
    return order, shard_size
