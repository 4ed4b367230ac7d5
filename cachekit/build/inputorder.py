"""Which shard each input goes to, and in what order: seeded hash buckets (mixed), or sorted chunks.

``shuffled`` (the default): every input goes to one of ``shards`` buckets by a hash of
(seed, its relative path), and a bucket's inputs are ordered by that hash too. Each shard is then
a uniform sample of the dataset (an ImageFolder tree's classes are mixed in every shard), and an
input's place depends only on its own path: adding or removing a file changes one shard, never
the cut of the others. The number of shards is fixed by the first build and recorded, so
``--update`` keeps it.

``sorted``: the inputs in path order, cut into contiguous runs of ``shard_size``.

Both are pure functions of the input paths and the recorded options: the same inputs give the same
shards whatever the worker count, executor or history of the cache.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from ..errors import UsageError
from ..store.manifest import ORDERS
from .sources.inputtable import Source, path_bytes, paths_bytes

__all__ = ["ORDERS", "input_key", "order_key", "order_keys", "shard_rows", "default_shards"]


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def input_key(path: str) -> int:
    """A stable 63-bit key of an input, from its relative path alone (seeds its augmented variants)."""
    return _hash64(b"cachekit-input\0" + path_bytes(path)) >> 1


def order_key(seed: int, path: str) -> int:
    """The 64-bit hash that places an input in a shuffled cache: its bucket, and its rank within it."""
    return _hash64(f"cachekit-order\0{seed}\0".encode() + path_bytes(path))


def default_shards(inputs: int, shard_size: int) -> int:
    """Buckets of about ``shard_size`` inputs each."""
    return max(1, math.ceil(inputs / max(1, shard_size)))


def order_keys(seed: int, paths) -> np.ndarray:
    """``order_key(seed, p)`` of every path, as uint64: the prefix hashed once and copied per path,
    the paths' bytes taken straight from a ``PathColumn``'s buffer (1M paths: about a second)."""
    base = hashlib.sha256(f"cachekit-order\0{seed}\0".encode())
    keys = np.empty(len(paths), dtype=np.uint64)
    step = 65536
    for lo in range(0, len(paths), step):
        digests = []
        for data in paths_bytes(paths, np.arange(lo, min(lo + step, len(paths)))):
            h = base.copy()
            h.update(data)
            digests.append(h.digest()[:8])
        keys[lo : lo + len(digests)] = np.frombuffer(b"".join(digests), dtype="<u8")
    return keys


def shard_rows(source: Source, order: dict, shard_size: int) -> list[np.ndarray]:
    """Each shard's input rows (indices into ``source``), in shard order; empty buckets are dropped."""
    n = len(source)
    if order["kind"] == "sorted":
        return [np.arange(a, min(a + shard_size, n)) for a in range(0, n, shard_size)]
    if order["kind"] != "shuffled":
        raise UsageError(f"unknown order {order['kind']!r} (choose from {', '.join(ORDERS)})")
    buckets = order["shards"]
    keys = order_keys(order["seed"], source.paths)
    bucket = keys % np.uint64(buckets)
    # within a bucket by the hash; the row breaks the (astronomically unlikely) ties
    rows = np.lexsort((np.arange(n), keys, bucket))
    starts = np.flatnonzero(np.diff(bucket[rows])) + 1  # nothing of size `buckets`: it may be huge
    return [part for part in np.split(rows, starts) if len(part)]
