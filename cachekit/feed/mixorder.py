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

``MixedOrder`` evaluates that order at any positions without building it: the jittered keys are
non-decreasing in each source, so the draws whose keys fall between two thresholds are a run of each
source's stream, found with a few keys each (the jitter's generator jumped ahead, ``PCG64.advance``),
and merged on their own. A rank reads a stretch of the epoch in memory of the stretch alone.
"""

from __future__ import annotations

import numpy as np

from .order import interleave, partition_pieces

__all__ = ["Source", "shares", "partition_counts", "source_pieces", "mixed_order", "MixedOrder"]


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


def partition_counts(sources: list[Source], weights, epoch_len: int, partitions: int) -> tuple[int, list]:
    """The partitions an epoch is cut into (at most the smallest source's samples; the first ones a
    sample longer where they do not divide it) and each partition's draws per source (``shares``)."""
    partitions = max(1, min(int(partitions), *(len(s) for s in sources)))
    m, r = divmod(int(epoch_len), partitions)
    return partitions, [shares(size, weights) for size in [m + 1] * r + [m] * (partitions - r)]


def source_pieces(source: Source, i: int, partitions: int, seed: int) -> list:
    """Source ``i``'s samples cut into ``partitions`` (``order.partition_pieces``, keyed per source)."""
    return partition_pieces(source.offsets[:-1], np.diff(source.offsets), partitions, seed + 7919 * (i + 1))


def _stream_key(seed: int, i: int, q: int) -> list[int]:
    """The key of source ``i``'s stream in partition ``q``."""
    return [seed % 2**64, i, q]


def _jitter_key(seed: int, epoch: int, q: int) -> list[int]:
    """The key of partition ``q``'s jitters in ``epoch`` (the interleaving of its sources' draws)."""
    return [seed % 2**64, epoch % 2**64, q, 0x313]


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
    partitions, counts_of = partition_counts(sources, weights, epoch_len, partitions)
    cut = [source_pieces(s, i, partitions, seed) for i, s in enumerate(sources)]
    orders = []
    for q, counts in enumerate(counts_of):
        draws = []
        for i, (source, n) in enumerate(zip(sources, counts.tolist())):
            draws.append(_stream(source, cut[i][q], _stream_key(seed, i, q), epoch * n, n, shuffle, kept))
        rng = np.random.default_rng(_jitter_key(seed, epoch, q)) if shuffle else None
        orders.append(_interleaved(draws, rng))
    return interleave(orders)


class MixedOrder:
    """``mixed_order(...)`` of one epoch evaluated at any positions (``at``, or indexing), equal to
    it position by position, in memory of the positions asked for and a chunk of the epoch.

    Partition ``q``'s draws are cut by the thresholds ``t / T`` of their keys into ``T`` chunks of
    about ``CHUNK`` draws: the draws of a chunk are a run ``k_lo .. k_hi`` of each source's draws
    (keys are non-decreasing in ``k``), its place in the merged order is the number of keys below
    its lower threshold, and within it the draws are merged as ``mixed_order`` merges them all
    (by key, then source, then ``k``: a stable sort of the sources' keys end to end).
    """

    #: Draws of a partition merged at once.
    CHUNK = 1 << 15

    def __init__(
        self,
        sources: list[Source],
        weights,
        epoch_len: int,
        seed: int,
        epoch: int,
        shuffle: bool = True,
        partitions: int = 1,
        kept: dict | None = None,
    ) -> None:
        self.sources, self.shuffle = sources, bool(shuffle)
        self.seed, self.epoch, self.len = int(seed), int(epoch), int(epoch_len)
        self.partitions, self.counts = partition_counts(sources, weights, self.len, partitions)
        self.kept = {} if kept is None else kept
        self._cut: dict[int, tuple] = {}
        self._below: dict[tuple[int, int], np.ndarray] = {}  # (q, t): keys below threshold t, per source
        self._rng_state: dict[int, dict] = {}
        self._chunk: tuple | None = None  # the last chunk merged: (q, t, its draws in order)

    def __len__(self) -> int:
        return self.len

    def __getitem__(self, positions) -> np.ndarray:
        if isinstance(positions, slice):
            positions = np.arange(*positions.indices(self.len), dtype=np.int64)
        elif np.ndim(positions) == 0:
            return int(self.at([positions])[0])
        return self.at(positions)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self.at(np.arange(self.len, dtype=np.int64))
        return whole if dtype is None else whole.astype(dtype)

    def at(self, positions) -> np.ndarray:
        """The indices at ``positions`` (each in ``range(len(self))``) of the epoch's order."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        out = np.empty(len(pos), dtype=np.int64)
        if not len(pos):
            return out
        if pos.min() < 0 or pos.max() >= self.len:
            raise IndexError(f"positions must lie in range({self.len})")
        parts = self.partitions
        q_of, r_of = pos % parts, pos // parts  # ``order.interleave``: position p is row p // Q of p % Q
        for q in np.unique(q_of).tolist():
            mine = np.flatnonzero(q_of == q)
            out[mine] = self._partition_at(q, r_of[mine])
        return out

    # -- one partition ---------------------------------------------------------------------------

    def _pieces(self, q: int, i: int):
        if i not in self._cut:
            self._cut[i] = source_pieces(self.sources[i], i, self.partitions, self.seed)
        return self._cut[i][q]

    def _jitter(self, q: int, i: int, lo: int, hi: int) -> np.ndarray:
        """Source ``i``'s jitters ``lo .. hi`` of partition ``q``: the doubles at ``sum(n_j, j < i) + lo``
        of the generator ``mixed_order`` draws them from, end to end."""
        if not self.shuffle:
            return np.full(hi - lo, 0.5)
        if q not in self._rng_state:
            key = _jitter_key(self.seed, self.epoch, q)
            self._rng_state[q] = np.random.PCG64(np.random.SeedSequence(key)).state
        bits = np.random.PCG64()
        bits.state = self._rng_state[q]
        bits.advance(int(self.counts[q][:i].sum()) + lo)
        return np.random.Generator(bits).random(hi - lo)

    def _keys(self, q: int, i: int, lo: int, hi: int) -> np.ndarray:
        n = int(self.counts[q][i])
        return (np.arange(lo, hi) + self._jitter(q, i, lo, hi)) / max(1, n)

    def _below_threshold(self, q: int, t: int, chunks: int) -> np.ndarray:
        """Per source, how many of partition ``q``'s keys lie below ``t / chunks`` (all of them at ``t == chunks``)."""
        memo = self._below.get((q, t))
        if memo is not None:
            return memo
        counts = self.counts[q]
        out = np.zeros(len(counts), dtype=np.int64)
        for i, n in enumerate(counts.tolist()):
            if t >= chunks:
                out[i] = n
                continue
            x = t / chunks
            k0 = int(np.floor(x * n))
            lo, hi = max(0, k0 - 3), min(n, k0 + 4)  # keys below lo are below x, from hi on not
            out[i] = lo + int((self._keys(q, i, lo, hi) < x).sum()) if hi > lo else min(lo, n)
        if len(self._below) > 64:
            self._below.clear()
        self._below[(q, t)] = out
        return out

    def _merged(self, q: int, t: int, chunks: int) -> np.ndarray:
        """Chunk ``t`` of partition ``q``: its draws in the merged order."""
        if self._chunk is not None and self._chunk[:2] == (q, t):
            return self._chunk[2]
        lo, hi = self._below_threshold(q, t, chunks), self._below_threshold(q, t + 1, chunks)
        draws, keys = [], []
        for i, source in enumerate(self.sources):
            a, b, n = int(lo[i]), int(hi[i]), int(self.counts[q][i])
            stream_key = _stream_key(self.seed, i, q)
            pieces = self._pieces(q, i)
            draws.append(_stream(source, pieces, stream_key, self.epoch * n + a, b - a, self.shuffle, self.kept))
            keys.append(self._keys(q, i, a, b))
        merged = np.concatenate(draws)[np.argsort(np.concatenate(keys), kind="stable")]
        self._chunk = (q, t, merged)
        return merged

    def _partition_at(self, q: int, rows: np.ndarray) -> np.ndarray:
        total = int(self.counts[q].sum())
        chunks = max(1, -(-total // self.CHUNK))
        out = np.empty(len(rows), dtype=np.int64)
        # the chunk a row is in: where its share of the partition puts it, give or take a chunk (a
        # threshold's keys below it differ from its share by less than a key a source)
        guess = rows * chunks // max(1, total)
        for g in np.unique(guess).tolist():
            mine = np.flatnonzero(guess == g)
            t = min(g, chunks - 1)
            while t > 0 and int(self._below_threshold(q, t, chunks).sum()) > rows[mine].min():
                t -= 1
            while len(mine):  # every row is below the last chunk's end (all the keys)
                start = int(self._below_threshold(q, t, chunks).sum())
                end = int(self._below_threshold(q, t + 1, chunks).sum())
                inside = (rows[mine] >= start) & (rows[mine] < end)
                if inside.any():
                    out[mine[inside]] = self._merged(q, t, chunks)[rows[mine[inside]] - start]
                    mine = mine[~inside]
                t += 1
        return out
