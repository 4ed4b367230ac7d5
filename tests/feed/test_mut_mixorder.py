"""An epoch's shares where many sources tie (found by mutation testing of ``cachekit.feed.mixorder``)."""

from __future__ import annotations

import numpy as np

from cachekit.feed.mixorder import Source, mixed_order, shares


def test_the_samples_left_over_go_to_the_first_of_many_tied_sources():
    """120 sources weighted 1, 2, 3 over and over and an epoch of 3: the three samples go to the
    first three sources of weight 3, as many tied remainders as a sort that is not stable reorders."""
    weights = np.tile([1.0, 2.0, 3.0], 40)
    got = shares(3, weights)
    assert np.flatnonzero(got).tolist() == [2, 5, 8] and got.sum() == 3
    got = shares(250, weights)  # 240 by the floors (1, 2, 3 each), the 10 left to the first weight 3's
    assert got[0::3].tolist() == [1] * 40 and got[1::3].tolist() == [2] * 40
    assert got[2::3].tolist() == [4] * 10 + [3] * 30


def test_a_mix_of_many_tied_sources_reads_the_first_ones_when_the_epoch_is_short():
    sources = [Source(10 * i, np.array([0, 10]), 10, True) for i in range(60)]
    order = mixed_order(sources, np.tile([1.0, 2.0, 3.0], 20), 3, seed=4, epoch=0)
    assert sorted(int(v) // 10 for v in order) == [2, 5, 8]


def test_reading_the_whole_lazy_order_draws_each_sample_once_and_a_few_keys_a_threshold(monkeypatch):
    """Chunk after chunk, the ranks' reads draw each stream position once (a chunk merges its own
    draws, not the next chunk's too), and each threshold's keys are found once (a handful of keys
    per source), however often the chunk search asks for it."""
    from cachekit.feed import mixorder
    from cachekit.feed.mixorder import MixedOrder

    monkeypatch.setattr(MixedOrder, "CHUNK", 97)
    sources = [Source(0, np.arange(0, 3001, 7), 30, True), Source(3000, np.arange(0, 2001, 10), 30, True)]
    whole = mixed_order(sources, [0.6, 0.4], 5_003, 7, 2, partitions=2)
    drawn, keys = [], []
    real_stream, real_jitter = mixorder._stream, MixedOrder._jitter
    monkeypatch.setattr(mixorder, "_stream", lambda *a: drawn.append(a[4]) or real_stream(*a))
    monkeypatch.setattr(
        MixedOrder, "_jitter", lambda self, *a: keys.append(a[3] - a[2]) or real_jitter(self, *a)
    )
    lazy = MixedOrder(sources, [0.6, 0.4], 5_003, 7, 2, partitions=2)
    for q in range(2):  # a rank of each node: its partition's positions, a batch at a time
        mine = np.arange(q, 5_003, 2)
        for start in range(0, len(mine), 64):
            assert np.array_equal(lazy.at(mine[start : start + 64]), whole[mine[start : start + 64]])
    assert sum(drawn) == 5_003
    chunks = sum(-(-int(c.sum()) // 97) for c in lazy.counts)
    assert 5_003 < sum(keys) <= 5_003 + 7 * len(sources) * chunks
