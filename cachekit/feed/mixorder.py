"""An epoch's order over several caches mixed by weight: a pure function of (seed, epoch), like ``order``.

Each source has an endless *stream*: pass after pass over its samples, each pass its own block
order (``order.block_order``), so within a pass every sample comes exactly once. Epoch ``e`` takes
the next ``n_i`` samples of source ``i``'s stream (``n_i``: its weight's share of the epoch,
largest remainders), so a small source with a large weight is read pass after pass and a large
one with a small weight moves on through its pass over several epochs. The sources' draws are
then interleaved by jittered strata (source ``i``'s ``k``-th draw at ``(k + u) / n_i``), so any
stretch of the epoch, a batch too, holds each source in its proportion give or take a sample or two.

With node partitions every source is partitioned on its own (``order.partition_pieces``) and
partition ``q`` of the epoch mixes the sources' partition ``q``: a node reads the same samples of
every source every epoch.
"""

from __future__ import annotations

import numpy as np

from .order import block_order, interleave, partition_pieces

__all__ = ["Source", "shares", "mixed_order"]


class Source:
    """One mixed cache as the order sees it: where its indices start, its shard offsets, its window."""

    def __init__(self, start: int, shard_offsets: np.ndarray, window: int, ramp: bool) -> None:
        self.start = int(start)
        self.offsets = np.asarray(shard_offsets, dtype=np.int64)
        self.window, self.ramp = max(1, int(window)), bool(ramp)

    def __len__(self) -> int:
        return int(self.offsets[-1])


def shares(total: int, weights) -> np.ndarray:
    """``total`` split in proportion to ``weights`` (largest remainders, ties to the first)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = total * w / w.sum()
    out = np.floor(exact).astype(np.int64)
    left = int(total - out.sum())
    if left:
        out[np.argsort(-(exact - out), kind="stable")[:left]] += 1
    return out


def _stream(
    source: Source,
    pieces: tuple[np.ndarray, np.ndarray],
    key: list[int],
    begin: int,
    count: int,
    shuffle: bool,
) -> np.ndarray:
    """Positions ``begin .. begin + count`` of the source's endless stream over ``pieces``."""
    first, units = pieces
    length = int(units.sum())
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    if shuffle:
        passes = []
        for j in range(begin // length, (begin + count - 1) // length + 1):
            rng = np.random.default_rng([*key, j % 2**64])
            passes.append(block_order(first, units, rng, source.window, source.ramp))
    else:
        one = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in zip(first, units)])
        passes = [one] * ((begin + count - 1) // length - begin // length + 1)
    run = np.concatenate(passes)
    lo = begin - (begin // length) * length
    return run[lo : lo + count] + source.start


def _interleaved(draws: list[np.ndarray], rng: np.random.Generator | None) -> np.ndarray:
    """The sources' draws merged by jittered strata (evenly, in order, without ``rng``)."""
    keys = [
        (np.arange(len(d)) + (rng.random(len(d)) if rng is not None else 0.5)) / max(1, len(d)) for d in draws
    ]
    return np.concatenate(draws)[np.argsort(np.concatenate(keys), kind="stable")]


def mixed_order(
    sources: list[Source],
    weights,
    epoch_len: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    partitions: int = 1,
) -> np.ndarray:
    """The ``epoch_len`` indices of one epoch over the ``sources`` mixed by ``weights`` (see the module)."""
    partitions = max(1, min(int(partitions), *(len(s) for s in sources)))
    m, r = divmod(int(epoch_len), partitions)
    per_partition = [m + 1] * r + [m] * (partitions - r)
    cut = [
        partition_pieces(s.offsets[:-1], np.diff(s.offsets), partitions, seed + 7919 * (i + 1))
        for i, s in enumerate(sources)
    ]
    orders = []
    for q, size in enumerate(per_partition):
        counts = shares(size, weights)
        draws = []
        for i, (source, n) in enumerate(zip(sources, counts.tolist())):
            key = [seed % 2**64, i, q]
            draws.append(_stream(source, cut[i][q], key, epoch * n, n, shuffle))
        rng = np.random.default_rng([seed % 2**64, epoch % 2**64, q, 0x313]) if shuffle else None
        orders.append(_interleaved(draws, rng))
    return interleave(orders)
