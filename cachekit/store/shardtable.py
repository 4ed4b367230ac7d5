"""A format 5 manifest's shards: ``ShardInfo`` made on access from the mapped index, and the
checks that tie the manifest's counts to its index."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import CacheError
from .index import ShardIndex, check_record
from .jsonfields import get, get_int
from .limits import MAX_INT, MAX_SAMPLES
from .shardfiles import check_shard_name
from .shardinfo import ShardInfo

__all__ = ["ShardTable", "indexed_shards"]


class ShardTable(Sequence):
    """A format 5 manifest's shards: a sequence of ``ShardInfo`` made on access from the index
    (the names validated then), with the columns for whole-cache arithmetic (``offsets``, ``sizes``)."""

    _MEMO = 4096  # ShardInfo objects kept (a batch's shards are asked for again and again)

    def __init__(self, index: ShardIndex) -> None:
        self.index = index
        self._memo: dict[int, ShardInfo] = {}

    def __getstate__(self) -> dict:
        return {"index": self.index, "_memo": {}}

    def __len__(self) -> int:
        return len(self.index)

    def __eq__(self, other: object) -> bool:
        """The same index (its sha256), or the same shards listed."""
        if isinstance(other, ShardTable):
            return self.index.record["sha256"] == other.index.record["sha256"]
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    @property
    def offsets(self) -> np.ndarray:
        return self.index.columns["offsets"]

    @property
    def sizes(self) -> np.ndarray:
        return self.index.columns["bytes"]

    @property
    def samples(self) -> int:
        return int(self.index.record["samples"])

    def names(self) -> _Names:
        return _Names(self.index)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = int(k)
        if k < 0:
            k += len(self)
        if not 0 <= k < len(self):
            raise IndexError(f"shard {k} of {len(self)}")
        info = self._memo.get(k)
        if info is None:
            info = self._make(k)
            if len(self._memo) >= self._MEMO:
                self._memo.clear()
            self._memo[k] = info
        return info

    def _make(self, k: int) -> ShardInfo:
        c, ix = self.index.columns, self.index
        return ShardInfo(
            file=check_shard_name(ix.text("name", k), f"{ix.path.name}: shard {k}"),
            samples=int(c["offsets"][k + 1] - c["offsets"][k]),
            bytes=int(c["bytes"][k]),
            sha256=bytes(c["sha256"][k]).hex(),
            inputs=int(c["inputs"][k]),
            first=ix.text("first", k),
            last=ix.text("last", k),
            inputs_digest=bytes(c["inputs_digest"][k]).hex(),
            pixel_sum=tuple(float(x) for x in c["pixel_sum"][k]),
            pixel_sumsq=tuple(float(x) for x in c["pixel_sumsq"][k]),
            pixel_count=int(c["pixel_count"][k]),
        )

    def __iter__(self) -> Iterator:
        for k in range(len(self)):
            yield self._make(k)


class _Names(Sequence):
    """Shard file names of an index, read on access (for the node cache's plan board)."""

    def __init__(self, index: ShardIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return self.index.text("name", int(k))


def indexed_shards(obj: dict, shards, variants: int, where: str) -> tuple[ShardTable, dict]:
    """Format 5: the ``index`` record, and the mapped table of shards the caller opened from it."""
    if "shards" in obj:
        raise CacheError(f"{where}.shards: a version 5 manifest keeps its shards in its index, not a list")
    record = check_record(get(obj, "index", where), f"{where}.index")
    if shards is None:
        raise CacheError(f"{where}.index: the cache's shard index was not opened")
    if len(shards) != record["shards"] or get_int(obj, "num_shards", where, maximum=MAX_SAMPLES) != len(
        shards
    ):
        raise CacheError(f"{where}.index: {len(shards)} shards in the index, not the manifest's count")
    cols = shards.index.columns
    if get_int(obj, "total_bytes", where, maximum=MAX_INT) != int(cols["bytes"].sum()):
        raise CacheError(f"{where}.total_bytes: not the sum of the index's shard sizes")
    if (np.diff(cols["offsets"]) > cols["inputs"] * variants).any():
        raise CacheError(f"{where}.index: a shard holds more samples than its inputs x variants")
    return shards, record
