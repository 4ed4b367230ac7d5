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

from .order import interleave, partition_pieces

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


#: Samples of passes drawn together: a small source's passes come many at a time from one generator,
#: so an epoch's work is proportional to its samples, never to its passes (a 3-sample source read
#: 10**6 times an epoch is 3 * 10**6 samples of array work, not 10**6 generators and block orders).
PASS_GROUP_SAMPLES = 1 << 16


def _group_block_ids(units: np.ndarray, span: int, ramp: bool) -> np.ndarray:
    """``order._block_ids`` for many passes at once: ``units`` is passes x pieces (each row one
    pass's pieces in their drawn order); the loop runs over the pieces, every pass in step."""
    rows, k = units.shape
    ids = np.zeros((rows, k), dtype=np.int64)
    block = np.zeros(rows, dtype=np.int64)
    count = np.zeros(rows, dtype=np.int64)
    size = np.zeros(rows, dtype=np.int64)
    cap = np.full(rows, 1 if ramp else k, dtype=np.int64)
    for j in range(k):
        u = units[:, j]
        new = (count > 0) & ((count >= cap) | (size + u > span))
        block += new
        count[new] = 0
        size[new] = 0
        if ramp:
            cap[new] = block[new]
        ids[:, j] = block
        count += 1
        size += u
    return ids


def _pass_group(source: Source, first: np.ndarray, units: np.ndarray, key: list[int], group: int, per: int):
    """Passes ``group * per .. group * per + per - 1`` of the source's stream (one row each): every
    pass its pieces in a random order, grouped into blocks as ``order.block_order`` groups them
    (at most ``window`` samples, the ramp), samples shuffled within their block."""
    rng = np.random.default_rng([*key, group % 2**64])
    k, length = len(units), int(units.sum())
    perm = np.argsort(rng.random((per, k)), axis=1, kind="stable")
    f, u = first[perm], units[perm]  # passes x pieces, each row in its pass's order
    blocks = _group_block_ids(u, source.window, source.ramp)
    flat_u = u.reshape(-1)
    shift = np.repeat(f.reshape(-1) - (np.cumsum(flat_u) - flat_u), flat_u)
    run = np.arange(per * length, dtype=np.int64) + shift
    keys = np.repeat((np.arange(per)[:, None] * (k + 1) + blocks).reshape(-1), flat_u).astype(np.float64)
    keys += rng.random(per * length)
    return run[np.argsort(keys, kind="stable")].reshape(per, length)


def _stream(
    source: Source,
    pieces: tuple[np.ndarray, np.ndarray],
    key: list[int],
    begin: int,
    count: int,
    shuffle: bool,
    kept: dict | None = None,
) -> np.ndarray:
    """Positions ``begin .. begin + count`` of the source's endless stream over ``pieces``: pass
    after pass, each every sample once; passes drawn ``PASS_GROUP_SAMPLES`` samples' worth at a time.
    ``kept``: the last group of passes drawn, per stream, kept between calls, so a large source read a
    little an epoch draws its pass once, not once every epoch it spans."""
    first, units = np.asarray(pieces[0], dtype=np.int64), np.asarray(pieces[1], dtype=np.int64)
    length = int(units.sum())
    if count == 0 or length == 0:
        return np.zeros(0, dtype=np.int64)
    lo, hi = begin // length, (begin + count - 1) // length  # the passes touched
    if shuffle:
        per = max(1, PASS_GROUP_SAMPLES // length)
        groups = []
        for g in range(lo // per, hi // per + 1):
            last = kept.get(tuple(key)) if kept is not None else None
            if last is not None and last[0] == g:
                rows = last[1]
            else:
                rows = _pass_group(source, first, units, key, g, per)
                if kept is not None:
                    kept[tuple(key)] = (g, rows)
            groups.append(rows[max(lo - g * per, 0) : hi - g * per + 1])
        run = np.concatenate(groups).reshape(-1)
    else:
        one = np.concatenate([np.arange(a, a + n, dtype=np.int64) for a, n in zip(first, units)])
        run = np.tile(one, hi - lo + 1)
    start = begin - lo * length
    return run[start : start + count] + source.start


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
    kept: dict | None = None,
) -> np.ndarray:
    """The ``epoch_len`` indices of one epoch over the ``sources`` mixed by ``weights`` (see the module);
    ``kept``: a dict the caller keeps between epochs, holding each stream's last group of passes."""
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
            draws.append(_stream(source, cut[i][q], key, epoch * n, n, shuffle, kept))
        rng = np.random.default_rng([seed % 2**64, epoch % 2**64, q, 0x313]) if shuffle else None
        orders.append(_interleaved(draws, rng))
    return interleave(orders)
