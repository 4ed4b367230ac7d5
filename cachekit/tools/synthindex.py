"""A format 5 cache's index and manifest for any number of samples and shards, without the shards.

For measuring what does not read pixels (opening a cache, the epoch order, what a worker is sent)
at sizes this machine could never build: the index is written by the project's own writer
(``store.index.write_index_columns``) from columns made with array operations, and the manifest
by ``store.manifestio``; every shard file is absent, so a read fails (lazily, naming the shard).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

__all__ = ["write_synthetic_index"]


def _names(n: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """``shard-<20 hex>.<fmt>`` for shard ``k``, in one buffer, with array operations."""
    width = len(f"shard-{0:020x}.{fmt}")
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    k = np.arange(n, dtype=np.uint64)
    buf = np.empty((n, width), dtype=np.uint8)
    buf[:, :6] = np.frombuffer(b"shard-", dtype=np.uint8)
    for j in range(20):  # hex digits, most significant first
        buf[:, 6 + j] = digits[((k >> np.uint64(4 * (19 - j))) & np.uint64(15)).astype(np.int64)]
    buf[:, 26:] = np.frombuffer(f".{fmt}".encode(), dtype=np.uint8)
    return np.arange(n + 1, dtype=np.int64) * width, buf.reshape(-1)


def write_synthetic_index(
    root: str | os.PathLike,
    samples: int,
    shards: int,
    *,
    side: int = 8,
    classes: int = 10,
    seed: int = 0,
) -> Path:
    """A cache folder at ``root`` whose manifest and index describe ``samples`` samples of
    ``3 x side x side`` in ``shards`` class-mixed ``.pt`` shards (none written)."""
    from ..store.atomic import commit_file, sha256_path
    from ..store.index import INDEX_NAME, ShardIndex, index_record, write_index_columns
    from ..store.location import write_manifest
    from ..store.manifest import ArraySpec, Manifest, SampleSpec
    from ..store.shardtable import ShardTable

    if not 1 <= shards <= samples:
        raise ValueError(f"need 1 <= shards <= samples, got {shards} shards for {samples} samples")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    m, r = divmod(samples, shards)
    counts = np.array([m + 1] * r + [m] * (shards - r), dtype=np.int64)
    per_sample = 3 * side * side
    offsets = np.concatenate([[0], np.cumsum(counts)])
    first = np.char.encode(np.char.add("synthetic/", np.char.zfill(offsets[:-1].astype(str), 12)))
    last = np.char.encode(np.char.add("synthetic/", np.char.zfill((offsets[1:] - 1).astype(str), 12)))
    cols = {
        "offsets": offsets,
        "bytes": counts * per_sample + 2048,
        "sha256": rng.integers(0, 256, (shards, 32), dtype=np.uint8),
        "inputs": counts,
        "inputs_digest": rng.integers(0, 256, (shards, 32), dtype=np.uint8),
        "pixel_sum": np.repeat(counts[:, None] * side * side * 127.5, 3, axis=1),
        "pixel_sumsq": np.repeat(counts[:, None] * side * side * 21717.5, 3, axis=1),
        "pixel_count": counts * side * side,
    }
    cols["name_offsets"], cols["name_bytes"] = _names(shards, "pt")
    for key, text in (("first", first), ("last", last)):
        width = text.dtype.itemsize  # every entry has the same width (zero-padded numbers)
        cols[f"{key}_offsets"] = np.arange(shards + 1, dtype=np.int64) * width
        cols[f"{key}_bytes"] = np.frombuffer(text.tobytes(), dtype=np.uint8)
    part = root / ".index.synthetic"
    write_index_columns(part, cols, 3)
    digest = sha256_path(part)
    name = INDEX_NAME.format(digest=digest[:16])
    size, _ = commit_file(root / name, lambda tmp: os.replace(part, tmp))
    record = index_record(name, size, digest, shards, samples)
    manifest = Manifest(
        format="pt",
        sample=SampleSpec(shape=(3, side, side), extras={"orig_size": ArraySpec((2,), "<i4")}),
        shards=ShardTable(ShardIndex(root / name, record)),
        classes=tuple(f"class_{c:03d}" for c in range(classes)),
        pipeline={"name": "synthetic", "size": side, "steps": []},
        fingerprint=hashlib.sha256(f"synthetic-index:{samples}:{shards}:{side}:{seed}".encode()).hexdigest(),
        mean=(0.5, 0.5, 0.5),
        std=(0.2887, 0.2887, 0.2887),
        format_options={"compression": "none", "store": "pixels", "shard_size": int(counts.max())},
        source={"layout": "synthetic", "inputs": samples},
        order={"kind": "shuffled", "seed": seed, "shards": shards},
        index=record,
    )
    write_manifest(root, manifest)
    return root
