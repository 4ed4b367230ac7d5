"""An epoch's order: shards shuffled, samples shuffled within windows, optionally in node partitions.

Everything here is a pure function of (seed, epoch) and the shard sizes, so every rank computes
the same order without talking to the others. ``ShardAwareDistributedSampler`` deals it out.
"""

from __future__ import annotations

import numpy as np

from ..constants import SHUFFLE_WINDOW_SAMPLES

__all__ = [
    "DEFAULT_GROUP_SPREAD",
    "default_window",
    "epoch_order",
    "spread_groups",
    "shard_partitions",
    "node_partitions",
    "slot_of_rank",
]

#: Samples a rank reads between two variants of one input (augmented caches) by default;
#: ``make_loader`` uses its batch size, so that variants never share a batch.
DEFAULT_GROUP_SPREAD = 64


def default_window(dataset, samples: int) -> int:
    """``SHUFFLE_WINDOW_SAMPLES`` for caches whose shards are class-mixed, else all ``samples``."""
    return SHUFFLE_WINDOW_SAMPLES if getattr(dataset, "shards_mixed", False) else max(1, samples)


def _units_of_shards(starts: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Every unit of the given shards once, shard by shard, the shards in a random order."""
    perm = rng.permutation(len(counts))
    starts, counts = starts[perm], counts[perm]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)  # unit k of the run -> its index
    return np.arange(total, dtype=np.int64) + shift


def _windowed(units: np.ndarray, span: int, rng: np.random.Generator) -> np.ndarray:
    """Shuffle within consecutive windows of ``span`` units (all of them when ``span`` covers them)."""
    if span >= len(units):
        return rng.permutation(units)
    keys = np.arange(len(units)) // span + rng.random(len(units))  # sort by (window, random key)
    return units[np.argsort(keys, kind="stable")]


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


def shard_partitions(counts: np.ndarray, partitions: int, seed: int) -> list[np.ndarray]:
    """The shards split into ``partitions`` sets of about equal sample counts, the same every epoch."""
    n = len(counts)
    partitions = max(1, min(partitions, n))
    perm = np.random.default_rng([seed % 2**64, 0x9A27]).permutation(n)
    cumulative = np.cumsum(counts[perm])
    targets = cumulative[-1] * np.arange(1, partitions) / partitions if n else np.zeros(0)
    cuts = np.searchsorted(cumulative, targets, side="left") + 1
    cuts = np.clip(cuts, np.arange(1, partitions), n - partitions + np.arange(1, partitions))
    cuts = np.maximum.accumulate(cuts)  # every partition keeps at least one shard
    return np.split(perm, cuts)


def epoch_order(
    shard_offsets: np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    window: int | None = None,
    group: int = 1,
    partitions: int = 1,
) -> np.ndarray:
    """The order of one epoch's units (runs of ``group`` samples: one input's augmented variants;
    samples when ``group`` is 1), before they are dealt out to ranks.

    Shards come in a random order and their units are shuffled within windows of ``window``
    samples (None: all of them), from (seed, epoch) alone. With ``partitions`` > 1 the shards
    are split into that many fixed sets (``shard_partitions``), each ordered on its own, and the
    orders interleaved: position ``p`` comes from partition ``p % partitions`` for as many units as
    the smallest partition holds; the rest (less than a shard per partition) follow in a shuffled
    tail, so every unit comes exactly once.
    """
    offsets = np.asarray(shard_offsets, dtype=np.int64)
    units_total = int(offsets[-1]) // group
    if not shuffle:
        return np.arange(units_total, dtype=np.int64)
    starts, counts = offsets[:-1] // group, np.diff(offsets) // group
    span = max(1, (window or int(offsets[-1])) // group)
    if partitions <= 1:
        rng = np.random.default_rng([seed % 2**64, epoch % 2**64])
        return _windowed(_units_of_shards(starts, counts, rng), span, rng)
    orders = []
    for k, shards in enumerate(shard_partitions(counts, partitions, seed)):
        rng = np.random.default_rng([seed % 2**64, epoch % 2**64, k + 1])
        orders.append(_windowed(_units_of_shards(starts[shards], counts[shards], rng), span, rng))
    # Interleave as many units of each as the shortest holds; the few left over (partitions differ
    # by less than a shard) follow, in a shuffled tail: every unit exactly once, most node-local.
    core = min(len(o) for o in orders)
    interleaved = np.stack([o[:core] for o in orders], axis=1).reshape(-1)
    rng = np.random.default_rng([seed % 2**64, epoch % 2**64, 0x7A11])
    tail = rng.permutation(np.concatenate([o[core:] for o in orders]))
    return np.concatenate([interleaved, tail])


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
