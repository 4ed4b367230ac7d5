"""An epoch's order: fixed node partitions, shards shuffled in blocks of a few, the first blocks small.

Everything here is a pure function of (seed, epoch) and the shard sizes, so every rank computes
the same order without talking to the others. ``ShardAwareDistributedSampler`` deals it out.

The order is built from *pieces*: a whole shard, or the part of one that falls in a node's
partition. Each epoch the pieces are shuffled and grouped into *blocks* (as MosaicML Streaming's
block shuffles do): a block holds at most ``window`` samples, and the first blocks of an epoch
hold 1, 1, 2, 3, ... pieces (the *ramp*), so that the first batches need a shard or two instead of
a whole window of them. Samples are shuffled within their block; blocks follow one another.
"""

from __future__ import annotations

import numpy as np

from ..constants import SHUFFLE_BLOCK_SHARDS, SHUFFLE_WINDOW_SAMPLES

__all__ = [
    "DEFAULT_GROUP_SPREAD",
    "default_window",
    "epoch_order",
    "block_order",
    "partition_pieces",
    "interleave",
    "pad_position",
    "spread_groups",
    "node_partitions",
    "slot_of_rank",
]

#: Samples a rank reads between two variants of one input (augmented caches) by default;
#: ``make_loader`` uses its batch size, so that variants never share a batch.
DEFAULT_GROUP_SPREAD = 64


def default_window(dataset, samples: int, processes: int = 1, partitions: int = 1) -> int:
    """Samples shuffled together by default.

    Caches whose shards are class-mixed (built in the default shuffled order) are shuffled in
    blocks: on object storage ``SHUFFLE_BLOCK_SHARDS`` shards' worth (few shards to download and
    pin at once), fewer when the node cache could not hold two blocks for ``processes`` reading
    processes (``dataset.block_shards(processes)``) or when a block would be more than an eighth of
    a node's partition (a block's shards must all be there before it is read: downloads ahead need
    a few blocks' time to get ahead of the reader); ``SHUFFLE_WINDOW_SAMPLES`` on a local disk. Any
    other cache is shuffled whole.
    """
    if not getattr(dataset, "shards_mixed", False):
        return max(1, samples)
    offsets = getattr(dataset, "shard_offsets", None)
    if getattr(dataset, "url", None) and offsets is not None and len(offsets) > 1:
        fit = getattr(dataset, "block_shards", None)  # fewer for a tight limit
        shards = fit(processes) if callable(fit) else SHUFFLE_BLOCK_SHARDS
        shards = min(int(shards), (len(offsets) - 1) // (8 * max(1, int(partitions))))
        return max(1, max(1, shards) * int(np.median(np.diff(offsets))))
    return SHUFFLE_WINDOW_SAMPLES


def partition_pieces(
    starts: np.ndarray, counts: np.ndarray, partitions: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each partition's pieces as ``(first unit, units)`` arrays, the same every epoch.

    The shards, in an order drawn from ``seed`` alone, are laid end to end and cut into
    ``partitions`` runs of equal length (the first ones one unit longer when it does not divide):
    a partition is whole shards plus at most two parts of shards it shares with its neighbours.
    So every unit is in exactly one partition, and the partitions differ by at most one unit.
    """
    starts, counts = np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    partitions = max(1, min(int(partitions), total))
    if partitions == 1:
        return [(starts, counts)]
    perm = np.random.default_rng([seed % 2**64, 0x9A27]).permutation(len(counts))
    c = counts[perm]
    ends = np.cumsum(c)
    begins = ends - c
    m, r = divmod(total, partitions)
    bounds = np.concatenate([[0], np.cumsum([m + 1] * r + [m] * (partitions - r))])
    out = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        sel = (ends > lo) & (begins < hi) & (c > 0)
        first = np.maximum(begins[sel], lo)
        out.append((starts[perm[sel]] + first - begins[sel], np.minimum(ends[sel], hi) - first))
    return out


def _block_ids(units: np.ndarray, span: int, ramp: bool) -> np.ndarray:
    """The block of each piece, in order: at most ``span`` units a block (one piece at least), and
    with ``ramp`` at most 1, 1, 2, 3, ... pieces in the first blocks: each block one shard more than
    the last, so the next block downloads while this one is read even on a link nearly full."""
    ids = np.empty(len(units), dtype=np.int64)
    block = count = size = 0
    cap = 1 if ramp else len(units)
    for j, u in enumerate(units.tolist()):
        if count and (count >= cap or size + u > span):
            block += 1
            count = size = 0
            if ramp:
                cap = block
        ids[j] = block
        count += 1
        size += u
    return ids


def block_order(
    first: np.ndarray, units: np.ndarray, rng: np.random.Generator, span: int, ramp: bool = False
) -> np.ndarray:
    """Every unit of the given pieces once: pieces in a random order, grouped into blocks
    (``_block_ids``), units shuffled within their block."""
    perm = rng.permutation(len(units))
    first, units = np.asarray(first)[perm], np.asarray(units)[perm]
    total = int(units.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(first - (np.cumsum(units) - units), units)  # unit k of the run -> its index
    run = np.arange(total, dtype=np.int64) + shift
    blocks = _block_ids(units, span, ramp)
    if blocks[-1] == 0:
        return rng.permutation(run)
    keys = np.repeat(blocks, units) + rng.random(total)  # sort by (block, random key)
    return run[np.argsort(keys, kind="stable")]


def interleave(orders: list[np.ndarray]) -> np.ndarray:
    """Round robin over the partitions' orders: position ``p`` comes from partition ``p % n`` while
    every partition has units left; partitions that differ by one unit (the longer ones first,
    as ``partition_pieces`` cuts them) keep that rule to the end."""
    if len(orders) == 1:
        return orders[0]
    keys = np.concatenate([np.arange(len(o), dtype=np.int64) * len(orders) + q for q, o in enumerate(orders)])
    return np.concatenate(orders)[np.argsort(keys, kind="stable")]


def pad_position(position: int, total: int, partitions: int) -> int:
    """The position of the order that pads position ``position`` >= ``total`` of a dealt epoch:
    the start of the order again (as torch does), on a position of the same partition."""
    extra = position - total
    if partitions <= 1 or total < partitions:
        return extra % max(1, total)
    core = total - total % partitions  # positions below it run round robin over the partitions
    return (extra - extra % partitions + position % partitions) % core


def epoch_order(
    shard_offsets: np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    window: int | None = None,
    group: int = 1,
    partitions: int = 1,
    ramp: bool = False,
) -> np.ndarray:
    """The order of one epoch's units (runs of ``group`` samples: one input's augmented variants;
    samples when ``group`` is 1), before they are dealt out to ranks.

    Each partition's pieces (``partition_pieces``) are ordered on their own (``block_order``:
    blocks of at most ``window`` samples, None: all of them; ``ramp``: the first blocks small),
    from (seed, epoch) alone, and the partitions are interleaved (``interleave``): position ``p``
    comes from partition ``p % partitions``, so every unit comes exactly once and the ranks that
    read partition ``q``'s positions read only its samples.
    """
    offsets = np.asarray(shard_offsets, dtype=np.int64)
    units_total = int(offsets[-1]) // group
    if not shuffle:
        return np.arange(units_total, dtype=np.int64)
    starts, counts = offsets[:-1] // group, np.diff(offsets) // group
    span = max(1, (window or int(offsets[-1])) // group)
    pieces = partition_pieces(starts, counts, partitions, seed)
    orders = []
    for q, (first, units) in enumerate(pieces):
        key = [seed % 2**64, epoch % 2**64] + ([q + 1] if len(pieces) > 1 else [])
        orders.append(block_order(first, units, np.random.default_rng(key), span, ramp))
    return interleave(orders)


def spread_groups(units: np.ndarray, group: int, spread: int = DEFAULT_GROUP_SPREAD) -> np.ndarray:
    """One rank's units as samples: variant-major within blocks of ``spread`` units, so one
    input's variants are at least ``spread`` samples apart, yet all on this rank.

    With ``spread`` the batch size, a block's variant ``v`` fills exactly one batch: variants never
    share a batch. A short last block joins the one before it (its variants are then further
    apart, never closer); a rank with fewer than ``spread`` units cannot keep them apart.
    """
    variants = np.arange(group, dtype=np.int64)
    starts = list(range(0, len(units), spread))
    if len(starts) > 1 and len(units) - starts[-1] < spread:
        starts.pop()
    bounds = [*starts, len(units)]
    parts = [
        (units[lo:hi][None, :] * group + variants[:, None]).reshape(-1) for lo, hi in zip(bounds, bounds[1:])
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def node_partitions(dataset, world: int, local: int) -> int:
    """Default partitions: one per node for caches on object storage (each node then reads the same
    shards every epoch, so its node-local shard cache stays warm), else one."""
    if getattr(dataset, "url", None) and local > 0 and world % local == 0:
        return max(1, min(world // local, len(getattr(dataset, "shard_offsets", [0, 0])) - 1))
    return 1


def slot_of_rank(rank: int, world: int, partitions: int, local: int) -> int:
    """Which position class (``p % world``) rank ``rank`` reads, so that a node's ranks read its own
    partitions. Positions ``p`` come from partition ``p % partitions``; sorting the classes by
    partition and handing them out node by node keeps each node on as few partitions as possible.
    Without the divisibility this needs, the plain rank (no node stability, same samples)."""
    if partitions <= 1 or world % partitions or local < 1 or world % local:
        return rank
    slots = sorted(range(world), key=lambda s: (s % partitions, s // partitions))
    return slots[rank]
