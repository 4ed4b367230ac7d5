"""Download ahead of need: the sampler knows the order, so upcoming shards are fetched in the background.

At the start of a pass the loader gives the rank's whole index order (``plan``), and how to get
the next epoch's; as it hands out batches it says where it is (``advance``). A few threads keep
the next shards of that order (in order of first use) on the node, within a lookahead that fits
the node cache's byte limit, so the training step finds its shards downloaded instead of waiting
for them. The order and the position also go to ``on_plan`` / ``on_advance`` (the node's plan
board, ``stream.eviction``: the node cache evicts the shard needed furthest ahead).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

__all__ = ["ShardFetcher"]

log = logging.getLogger("cachekit")


class ShardFetcher:
    """Keeps the next ``ahead`` shards of the planned order fetched, ``concurrency`` at a time."""

    def __init__(
        self,
        fetch: Callable[[int], None],
        shard_offsets: np.ndarray,
        *,
        ahead: int,
        concurrency: int = 4,
        on_plan: Callable[[np.ndarray, np.ndarray | None], None] | None = None,
        on_advance: Callable[[int], None] | None = None,
    ):
        self._fetch = fetch
        self._on_plan, self._on_advance = on_plan, on_advance
        self._handed = 0  # samples of this pass handed out
        self._offsets = np.asarray(shard_offsets, dtype=np.int64)
        self.ahead = max(1, int(ahead))
        self._pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="cachekit-fetch")
        self._lock = threading.Lock()
        self._sequence: list[int] = []
        self._rank_of: dict[int, int] = {}
        self._position = 0
        self._futures: dict[int, Future] = {}
        self.errors: list[BaseException] = []

    def _shards(self, indices) -> np.ndarray:
        return np.searchsorted(self._offsets, np.asarray(indices, dtype=np.int64), side="right") - 1

    def plan(self, indices, following: Callable[[], np.ndarray] | None = None) -> None:
        """A new pass will read ``indices`` in this order; ``following()`` gives the next epoch's
        (asked in the background: the first batch does not wait for it)."""
        shards = self._shards(indices)
        _, first = np.unique(shards, return_index=True)
        sequence = shards[np.sort(first)].tolist()
        with self._lock:
            self._sequence = sequence
            self._rank_of = {s: k for k, s in enumerate(sequence)}
            self._position = 0
            self._handed = 0
            self._futures = {s: f for s, f in self._futures.items() if not f.done()}
        if self._on_plan is not None:
            self._on_plan(shards, None)
            if following is not None:
                self._pool.submit(self._plan_following, shards, following)
        self._kick()

    def _plan_following(self, shards: np.ndarray, following: Callable[[], np.ndarray]) -> None:
        try:
            after = self._shards(following())
            with self._lock:
                handed = self._handed
            self._on_plan(shards, after)
            self._on_advance(handed)
        except Exception as exc:  # a plan is advice: eviction falls back on least recently used
            log.debug("planning the next epoch failed: %s", exc)

    def advance(self, indices) -> None:
        """The loader is handing out a batch of ``indices``: fetch what comes after its shards."""
        ranks = [self._rank_of.get(s, -1) for s in np.unique(self._shards(indices)).tolist()]
        with self._lock:
            self._position = max(self._position, max(ranks, default=-1))
            self._handed += len(indices)
            handed = self._handed
        if self._on_advance is not None:
            self._on_advance(handed - len(indices))  # the batch's samples are still to be read
        self._kick()

    def _kick(self) -> None:
        with self._lock:
            wanted = self._sequence[self._position : self._position + self.ahead]
            for shard in wanted:
                if shard not in self._futures:
                    future = self._pool.submit(self._run, shard)
                    self._futures[shard] = future

    def _run(self, shard: int) -> None:
        try:
            self._fetch(shard)
        except BaseException as exc:  # the read that needs it fetches again, and raises there
            log.debug("download ahead of shard %d failed: %s", shard, exc)
            self.errors.append(exc)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
