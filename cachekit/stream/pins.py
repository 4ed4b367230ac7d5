"""How many shards one batch can pin at once: the bound a loader over object storage is checked against.

Every reading process pins the shards of the batch it is reading (their node-local copies cannot
be evicted while a reader has them open), so a loader whose processes could pin more than the
node cache holds would wait for room forever. The bound follows the sampler's order
(``feed/order.py``): one rank's batch of ``b`` samples is ``b`` positions ``world`` apart in the
global order, so ``b * world / partitions`` consecutive positions of its partition's order; those
positions lie in a few blocks of whole shards (``window`` samples at most each), and samples are
shuffled within a block only. So a batch touches at most the pieces of the two blocks at its
ends plus the pieces wholly inside it, and never more shards than it has samples.
"""

from __future__ import annotations

import numpy as np

__all__ = ["shards_per_batch", "bytes_per_batch", "pieces_within"]


def pieces_within(counts: np.ndarray, samples: int) -> int:
    """The most pieces (shards, by their sample ``counts``) that ``samples`` samples can hold whole:
    the smallest ones, one after another."""
    sizes = np.sort(np.asarray(counts, dtype=np.int64)[np.asarray(counts) > 0])
    return int(np.searchsorted(np.cumsum(sizes), samples, side="right"))


def _parts(
    offsets: np.ndarray, batch_size: int, window: int, world: int, partitions: int
) -> tuple[int, int, int, int]:
    """``(pieces a block, pieces wholly inside a batch, the most shards in all, samples it spans)``."""
    counts = np.diff(offsets)
    shards = int((counts > 0).sum())
    partitions = max(1, int(partitions))
    cut = 2 if partitions > 1 else 0  # a partition may hold parts of two shards it shares at its cuts
    span = -(-int(batch_size) * max(1, int(world)) // partitions)  # positions of its partition's order
    per_block = max(1, pieces_within(counts, int(window))) + cut
    inside = pieces_within(counts, max(0, span - 2)) + cut  # blocks wholly inside the batch's span
    in_partition = (
        shards
        if partitions == 1
        else min(shards, pieces_within(counts, -(-int(offsets[-1]) // partitions)) + cut)
    )
    return per_block, inside, min(int(batch_size), in_partition), span


def shards_per_batch(
    shard_offsets: np.ndarray,
    batch_size: int,
    window: int,
    *,
    world: int = 1,
    partitions: int = 1,
) -> int:
    """The most shards one rank's batch of ``batch_size`` samples can touch, in the sampler's order
    (blocks of at most ``window`` samples; ``partitions`` fixed sets, each read by
    ``world / partitions`` ranks in turn)."""
    offsets = np.asarray(shard_offsets, dtype=np.int64)
    if int((np.diff(offsets) > 0).sum()) == 0:
        return 0
    per_block, inside, most, _ = _parts(offsets, batch_size, window, world, partitions)
    return max(1, min(most, 2 * per_block + inside))


def bytes_per_batch(
    shard_offsets: np.ndarray,
    shard_bytes,
    batch_size: int,
    window: int,
    *,
    world: int = 1,
    partitions: int = 1,
) -> int:
    """The most bytes of shards one rank's batch can pin at once: ``shards_per_batch``'s shards, each
    at the most bytes it could have. The blocks at the batch's two ends may be any shards (the
    largest); the pieces wholly inside it are shards of fewer samples than the batch spans, so a
    cache of large shards and one small last shard needs two large ones and the small one, not
    three large ones."""
    offsets = np.asarray(shard_offsets, dtype=np.int64)
    counts = np.diff(offsets)
    sizes = np.asarray(shard_bytes, dtype=np.int64)[counts > 0]
    if not len(sizes):
        return 0
    per_block, inside, most, span = _parts(offsets, batch_size, window, world, partitions)
    largest = np.sort(sizes)[::-1]
    small = np.sort(np.asarray(shard_bytes, dtype=np.int64)[(counts > 0) & (counts <= max(0, span - 2))])[
        ::-1
    ]
    cut = 2 if max(1, int(partitions)) > 1 else 0  # cut pieces: any shard
    ends = int(largest[: 2 * per_block + cut].sum())
    within = int(small[: max(0, inside - cut)].sum())
    return int(min(ends + within, largest[: max(1, most)].sum()))
