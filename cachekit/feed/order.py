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
from .permute import mix64, permute

__all__ = [
    "DEFAULT_GROUP_SPREAD",
    "default_window",
    "epoch_order",
    "units_at",
    "block_order",
    "block_bounds",
    "PieceOrder",
    "partition_pieces",
    "interleave",
    "pad_position",
    "pad_positions",
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


def _cut(starts: np.ndarray, counts: np.ndarray, partitions: int, seed: int):
    """The shards in the seed's order laid end to end, and the partitions' bounds in units."""
    perm = np.random.default_rng([seed % 2**64, 0x9A27]).permutation(len(counts))
    c = counts[perm]
    ends = np.cumsum(c)
    m, r = divmod(int(ends[-1]) if len(ends) else 0, partitions)
    bounds = np.concatenate([[0], np.cumsum([m + 1] * r + [m] * (partitions - r))])
    return perm, c, ends, bounds


def _piece(starts, perm, c, ends, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The pieces of the units ``lo .. hi`` of the shards laid end to end (a contiguous run of them)."""
    a, b = int(np.searchsorted(ends, lo, side="right")), int(np.searchsorted(ends - c, hi, side="left"))
    sel = np.arange(a, b)[c[a:b] > 0]
    begins = ends[sel] - c[sel]
    first = np.maximum(begins, lo)
    return starts[perm[sel]] + first - begins, np.minimum(ends[sel], hi) - first


def partition_pieces(
    starts: np.ndarray, counts: np.ndarray, partitions: int, seed: int, only: int | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each partition's pieces as ``(first unit, units)`` arrays, the same every epoch (``only``:
    just partition ``only``'s, as a list of one).

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
    perm, c, ends, bounds = _cut(starts, counts, partitions, seed)
    which = range(partitions) if only is None else [int(only)]
    return [_piece(starts, perm, c, ends, int(bounds[q]), int(bounds[q + 1])) for q in which]


def block_bounds(units: np.ndarray, span: int, ramp: bool) -> np.ndarray:
    """Where each block starts, as piece indices (and ``len(units)`` last): at most ``span`` units a
    block (one piece at least), and with ``ramp`` at most 1, 1, 2, 3, ... pieces in the first
    blocks: each block one shard more than the last, so the next block downloads while this one is
    read even on a link nearly full. Greedy, block by block (one search per block, not per piece)."""
    units = np.asarray(units, dtype=np.int64)
    n = len(units)
    cum = np.concatenate([[0], np.cumsum(units)])
    bounds = [0]
    j = block = 0
    while j < n:
        fit = int(np.searchsorted(cum, cum[j] + span, side="right")) - 1  # most pieces within span
        cap = max(1, block) if ramp else n
        j = min(max(fit, j + 1), j + cap, n)
        bounds.append(j)
        block += 1
    return np.asarray(bounds, dtype=np.int64)


class PieceOrder:
    """One epoch's order of a set of pieces, evaluated at any positions (``at``) without building it.

    The pieces are put in a random order (the first draw of ``rng``), grouped into blocks
    (``block_bounds``), and the units of each block permuted by a key drawn from ``rng`` and the
    block's number (``permute``). Memory: a few numbers per piece and per block; ``at(positions)``
    costs memory in proportion to ``positions``.
    """

    def __init__(self, first: np.ndarray, units: np.ndarray, rng: np.random.Generator, span: int, ramp: bool):
        perm = rng.permutation(len(units))
        self.first = np.asarray(first, dtype=np.int64)[perm]
        units = np.asarray(units, dtype=np.int64)[perm]
        self.cum = np.concatenate([[0], np.cumsum(units)])  # where each piece starts in the run
        self.total = int(self.cum[-1])
        self.block_start = self.cum[block_bounds(units, span, ramp)]
        self.key = np.uint64(int(rng.integers(0, 2**63)))

    #: Positions computed at once: the temporaries stay a few tens of MB whatever the share.
    CHUNK = 1 << 18

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The units at ``positions`` (each in ``range(total)``) of this order: 8 bytes a position,
        plus the temporaries of one chunk of them."""
        pos = np.asarray(positions, dtype=np.int64)
        if len(pos) <= self.CHUNK:
            return self._at(pos)
        out = np.empty(len(pos), dtype=np.int64)
        for lo in range(0, len(pos), self.CHUNK):
            out[lo : lo + self.CHUNK] = self._at(pos[lo : lo + self.CHUNK])
        return out

    def _at(self, pos: np.ndarray) -> np.ndarray:
        if not pos.size:
            return np.zeros(0, dtype=np.int64)
        block = np.searchsorted(self.block_start, pos, side="right") - 1
        lo = self.block_start[block]
        keys = mix64(self.key ^ mix64(block.astype(np.uint64)))
        run = lo + permute(pos - lo, self.block_start[block + 1] - lo, keys)
        piece = np.searchsorted(self.cum, run, side="right") - 1
        return self.first[piece] + (run - self.cum[piece])


def block_order(
    first: np.ndarray, units: np.ndarray, rng: np.random.Generator, span: int, ramp: bool = False
) -> np.ndarray:
    """Every unit of the given pieces once: pieces in a random order, grouped into blocks
    (``block_bounds``), units shuffled within their block (``PieceOrder``, whole)."""
    order = PieceOrder(first, units, rng, span, ramp)
    return order.at(np.arange(order.total, dtype=np.int64))


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
    return int(pad_positions(np.array([position], dtype=np.int64), total, partitions)[0])


def pad_positions(positions: np.ndarray, total: int, partitions: int) -> np.ndarray:
    """``pad_position`` of each of ``positions`` (all >= ``total``)."""
    positions = np.asarray(positions, dtype=np.int64)
    extra = positions - total
    if partitions <= 1 or total < partitions:
        return extra % max(1, total)
    core = total - total % partitions  # positions below it run round robin over the partitions
    return (extra - extra % partitions + positions % partitions) % core


def _setup(shard_offsets, seed: int, window, group: int, partitions: int):
    """Units per shard and the span of a block, in units, and the partitions that hold any."""
    offsets = np.asarray(shard_offsets, dtype=np.int64)
    starts, counts = offsets[:-1] // group, np.diff(offsets) // group
    span = max(1, (window or int(offsets[-1])) // group)
    return starts, counts, span, max(1, min(int(partitions), int(counts.sum())))


def _partition_order(starts, counts, span, seed, epoch, partitions, q, ramp) -> PieceOrder:
    """Partition ``q``'s order of this epoch (its rng: (seed, epoch[, q + 1]))."""
    (first, units) = partition_pieces(starts, counts, partitions, seed, only=q)[0]
    key = [seed % 2**64, epoch % 2**64] + ([q + 1] if partitions > 1 else [])
    return PieceOrder(first, units, np.random.default_rng(key), span, ramp)


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
    samples when ``group`` is 1), before they are dealt out to ranks: the whole of it, for
    inspection and tests. A rank computes only its own positions of it (``units_at``).

    Each partition's pieces (``partition_pieces``) are ordered on their own (``PieceOrder``:
    blocks of at most ``window`` samples, None: all of them; ``ramp``: the first blocks small),
    from (seed, epoch) alone, and the partitions are interleaved (``interleave``): position ``p``
    comes from partition ``p % partitions``, so every unit comes exactly once and the ranks that
    read partition ``q``'s positions read only its samples.
    """
    offsets = np.asarray(shard_offsets, dtype=np.int64)
    total = int(offsets[-1]) // group
    return units_at(
        offsets, seed, epoch, np.arange(total, dtype=np.int64), shuffle, window, group, partitions, ramp
    )


def units_at(
    shard_offsets: np.ndarray,
    seed: int,
    epoch: int,
    positions: np.ndarray,
    shuffle: bool = True,
    window: int | None = None,
    group: int = 1,
    partitions: int = 1,
    ramp: bool = False,
) -> np.ndarray:
    """The units at ``positions`` of ``epoch_order(...)``, computed from the partitions those
    positions fall in alone: memory in proportion to the positions plus the pieces of those
    partitions, never the whole order. Position ``p`` is position ``p // partitions`` of partition
    ``p % partitions``'s order (the partitions differ by at most one unit, the longer first)."""
    positions = np.asarray(positions, dtype=np.int64)
    if not shuffle or not positions.size:
        return positions.copy()
    starts, counts, span, parts = _setup(shard_offsets, seed, window, group, partitions)
    if parts == 1:
        return _partition_order(starts, counts, span, seed, epoch, 1, 0, ramp).at(positions)
    out = np.empty(len(positions), dtype=np.int64)
    q_of = positions % parts
    for q in np.unique(q_of).tolist():
        mine = q_of == q
        out[mine] = _partition_order(starts, counts, span, seed, epoch, parts, q, ramp).at(
            positions[mine] // parts
        )
    return out


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
