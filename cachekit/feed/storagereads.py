"""What a dataset over a cache on object storage does besides reading (``ShardStorage``, a base of
``CachedDataset``): refuse batches whose shards would not fit the node's cache, fetch the shards of
upcoming batches ahead of need, offer a mosaic the samples of the shards a batch pins anyway, and
demand a batch's missing shards together. For a local cache each is nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np

from ..stream.pins import bytes_per_batch, shards_per_batch

__all__ = ["ShardStorage"]


class ShardStorage:
    """The object-storage side of a dataset: ``_remote`` (a ``stream.remotecache.RemoteShards`` or
    None), ``manifest``, ``shard_offsets`` and ``_locate`` come from the dataset."""

    def check_batch_shards(
        self, batch_size: int, window: int, processes: int, *, world: int = 1, partitions: int = 1
    ) -> None:
        """For a cache on object storage: refuse batches that would pin more shards than fit.

        Each of ``processes`` reading processes on the node pins the shards of the batch it reads:
        at most ``stream.pins.shards_per_batch`` of them (blocks of ``window`` samples, ``world``
        ranks over ``partitions`` node partitions).
        """
        if self._remote is None:
            return
        touched = shards_per_batch(self.shard_offsets, batch_size, window, world=world, partitions=partitions)
        sizes = [s.bytes for s in self.manifest.shards]
        most = bytes_per_batch(
            self.shard_offsets, sizes, batch_size, window, world=world, partitions=partitions
        )
        self._remote.check_pins(touched, processes, most)

    def shard_pool(self, indices) -> np.ndarray:
        """Every index of the shards ``indices`` lie in, in order."""
        _, shards = self._locate(indices)
        ranges = [
            np.arange(self.shard_offsets[k], self.shard_offsets[k + 1]) for k in np.unique(shards).tolist()
        ]
        return np.concatenate(ranges).astype(np.int64) if ranges else np.zeros(0, np.int64)

    def mosaic_pool(self, indices) -> np.ndarray | None:
        """Where a mosaic's extra samples come from for a batch of ``indices``: a cache on object
        storage offers the samples of the shards the batch pins anyway (None: anywhere)."""
        return self.shard_pool(indices) if self.remote else None

    @property
    def remote(self) -> bool:
        """True when the shards are fetched into a node cache (a cache named by a URL)."""
        return self._remote is not None

    def block_shards(self, processes: int = 1) -> int | None:
        """Shards the sampler shuffles together by default on object storage, ``processes`` reading
        processes on the node pinning theirs (None: a local cache)."""
        return None if self._remote is None else self._remote.block_shards(processes)

    def plan_reads(self, indices, following: Callable[[], np.ndarray] | None = None) -> None:
        """This process will read ``indices`` in this order (then ``following()``'s, the next
        epoch's): fetch their shards ahead of need, and let the node cache evict by that order."""
        if self._remote is not None and len(indices):
            self._remote.fetcher(self.shard_offsets).plan(indices, following)

    def reading(self, indices) -> None:
        """A batch of ``indices`` is being read now: the lookahead moves past its shards."""
        if self._remote is not None and len(indices):
            self._remote.fetcher(self.shard_offsets).advance(indices)

    def _waiting(self, shards: list[int]):
        """A cache on object storage: the shards of a batch not on the node are demanded together."""
        if self._remote is None:
            return contextlib.nullcontext()
        return self._remote.waiting([self.manifest.shards[k] for k in shards])

