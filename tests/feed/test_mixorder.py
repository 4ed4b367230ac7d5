"""A mix's order piece by piece: each pass's blocks (the window, the ramp), the order without shuffle,
the shares of an epoch, and the lazy order as an array."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit.feed.mixorder import MixedOrder, Source, mixed_order, shares


def _one_source(shards: int, shard: int, window: int, ramp: bool) -> list[Source]:
    return [Source(0, np.arange(0, shards * shard + 1, shard), window, ramp)]


def _blocks(one_pass: np.ndarray, shard: int, bounds: list[int]) -> list[list[int]]:
    """The shards of each block of a pass cut at ``bounds``, checked to be whole shards, shuffled."""
    out = []
    for lo, hi in zip(bounds, bounds[1:]):
        block = one_pass[lo:hi]
        ids = sorted(set((block // shard).tolist()))
        assert sorted(block.tolist()) == [s * shard + j for s in ids for j in range(shard)], (lo, hi)
        assert len(ids) == (hi - lo) // shard and not np.array_equal(block, np.sort(block))
        if len(ids) > 1:  # the shards' samples are shuffled together, not read shard after shard
            assert np.count_nonzero(np.diff(block // shard)) > len(ids) - 1
        out.append(ids)
    return out


@pytest.mark.parametrize(
    "ramp, bounds",
    [
        (True, [0, 10, 20, 40, 70, 100, 130, 160, 190, 200]),  # 1, 1, 2, 3 shards, then the window's 3
        (False, [0, 30, 60, 90, 120, 150, 180, 200]),  # as many shards as fill the window exactly
    ],
)
def test_each_pass_reads_whole_shards_in_blocks_of_the_window_with_the_ramp(ramp, bounds):
    """Shards of 10 and a window of 30: a block holds the shards that fit the window (three, the
    window filled exactly), the ramp opens a pass with blocks of 1, 1, 2 shards; every pass of a small
    source read many times an epoch keeps that shape, each its own order of the shards."""
    order = mixed_order(_one_source(20, 10, 30, ramp), [1.0], 600, seed=5, epoch=0)
    passes = [_blocks(order[p * 200 : (p + 1) * 200], 10, bounds) for p in range(3)]
    assert passes[0] != passes[1] != passes[2]
    again = mixed_order(_one_source(20, 10, 30, ramp), [1.0], 200, seed=5, epoch=2)  # epoch 2: the third pass
    assert _blocks(again, 10, bounds) == passes[2]


def test_a_window_smaller_than_a_shard_reads_one_shard_a_block():
    order = mixed_order(_one_source(6, 10, 0, False), [1.0], 60, seed=1, epoch=0)
    assert len(_blocks(order, 10, list(range(0, 61, 10)))) == 6


def test_without_shuffle_each_source_is_read_in_order_and_spread_evenly():
    sources = [Source(0, np.array([0, 10, 20]), 30, True), Source(20, np.array([0, 5, 10]), 30, True)]
    first = mixed_order(sources, [2, 1], 45, seed=1, epoch=0, shuffle=False)
    assert first.tolist() == [
        0, 20, 1, 2, 21, 3, 4, 22, 5, 6, 23, 7, 8, 24, 9, 10, 25, 11, 12, 26, 13, 14, 27, 15, 16, 28, 17, 18, 29,
        19, 0, 20, 1, 2, 21, 3, 4, 22, 5, 6, 23, 7, 8, 24, 9,
    ]  # fmt: skip
    second = mixed_order(sources, [2, 1], 45, seed=1, epoch=1, shuffle=False)
    assert second[:6].tolist() == [10, 25, 11, 12, 26, 13]  # each stream goes on where the last epoch left it
    lazy = MixedOrder(sources, [2, 1], 45, 1, 1, shuffle=False)
    assert np.array_equal(lazy[:], second)


def test_shares_are_proportional_with_the_largest_remainders_and_ties_to_the_first():
    assert shares(10, [1, 1, 1]).tolist() == [4, 3, 3]
    assert shares(7, [0.5, 0.25, 0.25]).tolist() == [3, 2, 2]
    assert shares(9, [1, 2]).tolist() == [3, 6] and shares(0, [1, 2]).tolist() == [0, 0]
    assert shares(5, [0.2, 0.8]).dtype == np.int64


def test_the_lazy_order_as_an_array_is_the_whole_order():
    sources = [Source(0, np.arange(0, 61, 7), 30, True), Source(60, np.array([0, 40]), 30, True)]
    whole = mixed_order(sources, [0.6, 0.4], 333, seed=9, epoch=4, partitions=2)
    lazy = MixedOrder(sources, [0.6, 0.4], 333, 9, 4, partitions=2)
    assert np.array_equal(np.asarray(lazy), whole) and np.asarray(lazy).dtype == np.int64
    as32 = np.asarray(lazy, dtype=np.int32)
    assert as32.dtype == np.int32 and np.array_equal(as32, whole)
    assert lazy[7] == whole[7] and isinstance(lazy[7], int) and len(lazy.at([])) == 0
    with pytest.raises(IndexError, match=r"range\(333\)"):
        lazy.at([333])
    with pytest.raises(IndexError, match=r"range\(333\)"):
        lazy.at([-1, 0])


@pytest.mark.parametrize("ramp", [True, False])
@pytest.mark.parametrize("span", [1, 30, 100])
def test_many_passes_are_grouped_into_blocks_as_one_pass_is(ramp, span):
    """The blocks of many passes at once (each row a pass's pieces in its drawn order) are those
    ``order.block_bounds`` gives each pass alone, pieces larger than the window included."""
    from cachekit.feed.mixorder import _group_block_ids
    from cachekit.feed.order import block_bounds

    rng = np.random.default_rng(span + ramp)
    units = rng.integers(1, 45, size=(40, 12))
    units[:5, 0] = span + 5  # a pass that opens with a piece larger than the window
    got = _group_block_ids(units, span, ramp)
    for row, ids in zip(units, got):
        bounds = block_bounds(row, span, ramp)
        assert ids.tolist() == (np.searchsorted(bounds, np.arange(len(row)), side="right") - 1).tolist()


def test_the_order_of_a_seed_and_epoch_stays_what_it_was():
    """A saved state resumes on the order a later release computes: the order of (seed, epoch) is
    pinned, not only shaped right (a pass shuffled the other way round is as random, but not the same)."""
    sources = [Source(0, np.array([0, 4, 8, 12]), 5, True), Source(12, np.array([0, 3, 6]), 5, True)]
    want = [17, 13, 5, 6, 10, 2, 16, 14, 9, 3, 17, 1, 8, 12, 11, 0, 15, 13, 11, 2, 17, 12, 10, 3]
    assert mixed_order(sources, [0.6, 0.4], 24, seed=11, epoch=1, partitions=2).tolist() == want
    assert MixedOrder(sources, [0.6, 0.4], 24, 11, 1, partitions=2)[:].tolist() == want


def test_the_lazy_order_keeps_each_streams_pass_group_for_the_caller(monkeypatch):
    from cachekit.feed import mixorder

    drawn = []
    real = mixorder._pass_group
    monkeypatch.setattr(mixorder, "_pass_group", lambda *a: drawn.append(a[3]) or real(*a))
    monkeypatch.setattr(MixedOrder, "CHUNK", 50)
    sources = [Source(0, np.arange(0, 301, 10), 30, True), Source(300, np.arange(0, 201, 10), 30, True)]
    whole = mixed_order(sources, [0.5, 0.5], 400, 3, 0)
    drawn.clear()
    kept: dict = {}
    lazy = MixedOrder(sources, [0.5, 0.5], 400, 3, 0, kept=kept)
    assert np.array_equal(lazy[:], whole)  # eight chunks, each source's one group of passes drawn once
    assert sorted(map(tuple, drawn)) == [(3, 0, 0), (3, 1, 0)] and sorted(kept) == [(3, 0, 0), (3, 1, 0)]
    drawn.clear()
    own = MixedOrder(sources, [0.5, 0.5], 400, 3, 0)  # no dict given: it keeps its own
    assert np.array_equal(own[:], whole) and len(drawn) == 2


def test_positions_of_any_shape_are_read_flat():
    sources = [Source(0, np.arange(0, 61, 7), 30, True), Source(60, np.array([0, 40]), 30, True)]
    whole = mixed_order(sources, [0.6, 0.4], 100, seed=2, epoch=0)
    lazy = MixedOrder(sources, [0.6, 0.4], 100, 2, 0)
    assert lazy.at(np.array([[3, 1], [99, 0]])).tolist() == whole[[3, 1, 99, 0]].tolist()


def test_a_position_of_the_lazy_order_costs_a_chunk_not_the_epoch(monkeypatch):
    """Reading a few positions draws about one chunk of each partition (the chunk they are in),
    never the whole epoch: the order is cut where its share of the epoch puts each position."""
    from cachekit.feed import mixorder

    drawn = []
    real = mixorder._stream
    monkeypatch.setattr(mixorder, "_stream", lambda *a: drawn.append(a[4]) or real(*a))
    monkeypatch.setattr(MixedOrder, "CHUNK", 97)
    sources = [Source(0, np.arange(0, 3001, 7), 30, True), Source(3000, np.arange(0, 2001, 10), 30, True)]
    whole = mixed_order(sources, [0.6, 0.4], 5_003, 7, 2)
    for positions in ([2_500], [0], [5_002], [1_000, 1_001, 1_002]):
        drawn.clear()
        lazy = MixedOrder(sources, [0.6, 0.4], 5_003, 7, 2)
        assert lazy.at(positions).tolist() == whole[positions].tolist()
        assert 0 < sum(drawn) <= 2 * 97, (positions, sum(drawn))


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64 - 1])
def test_a_negative_seed_orders_as_the_seed_torch_wraps_it_to(seed):
    """Seeds run from -2**63 to 2**64 - 1 as torch.manual_seed's do, and a negative one names the same
    draws as its wrap: the streams' and the strata's generators are keyed by the seed modulo 2**64."""
    sources = [Source(0, np.arange(0, 61, 7), 30, True), Source(60, np.array([0, 40]), 30, True)]
    whole = mixed_order(sources, [0.6, 0.4], 150, seed=seed, epoch=3, partitions=2)
    wrapped = mixed_order(sources, [0.6, 0.4], 150, seed=seed % 2**64, epoch=3, partitions=2)
    assert whole.tolist() == wrapped.tolist()
    assert MixedOrder(sources, [0.6, 0.4], 150, seed, 3, partitions=2)[:].tolist() == whole.tolist()


@pytest.mark.parametrize("seed", range(6))
def test_a_source_with_one_draw_an_epoch_lands_where_the_lazy_order_puts_it(seed):
    """A source whose share of the epoch is one sample is placed by its one jittered key (``u / 1``)
    in the whole order and the lazy one alike."""
    sources = [Source(0, np.arange(0, 101, 10), 30, True), Source(100, np.array([0, 5]), 30, True)]
    whole = mixed_order(sources, [0.95, 0.05], 20, seed=seed, epoch=1)
    assert np.count_nonzero(whole >= 100) == 1
    assert MixedOrder(sources, [0.95, 0.05], 20, seed, 1)[:].tolist() == whole.tolist()


def test_the_whole_order_keeps_each_streams_pass_group_in_the_callers_dict(monkeypatch):
    """``mixed_order(kept=...)`` keeps each stream's last group of passes there, so the next epoch
    reuses it (no new draw) and still gives the order it gives without the dict."""
    from cachekit.feed import mixorder

    sources = [Source(0, np.arange(0, 301, 10), 30, True), Source(300, np.arange(0, 201, 10), 30, True)]
    plain = [mixed_order(sources, [0.5, 0.5], 100, 3, e) for e in (0, 1)]
    drawn = []
    real = mixorder._pass_group
    monkeypatch.setattr(mixorder, "_pass_group", lambda *a: drawn.append(a[3]) or real(*a))
    kept: dict = {}
    first = mixed_order(sources, [0.5, 0.5], 100, 3, 0, kept=kept)
    assert sorted(kept) == [(3, 0, 0), (3, 1, 0)] and len(drawn) == 2
    second = mixed_order(sources, [0.5, 0.5], 100, 3, 1, kept=kept)
    assert len(drawn) == 2  # epoch 1 reads on in the passes epoch 0 drew
    assert first.tolist() == plain[0].tolist() and second.tolist() == plain[1].tolist()


def test_every_group_of_passes_draws_its_own_order(monkeypatch):
    """Passes drawn a group at a time (here one pass a group) each get their own order of the shards
    and samples: group ``g``'s generator is keyed by ``g`` itself, so passes 0 and 2 never repeat."""
    from cachekit.feed import mixorder

    monkeypatch.setattr(mixorder, "PASS_GROUP_SAMPLES", 1)
    sources = _one_source(12, 5, 10, False)
    order = mixed_order(sources, [1.0], 4 * 60, seed=3, epoch=0)
    passes = [tuple(order[p * 60 : (p + 1) * 60].tolist()) for p in range(4)]
    assert all(sorted(p) == list(range(60)) for p in passes)
    assert len(set(passes)) == 4


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_source_whose_share_rounds_to_nothing_is_left_out_of_the_epoch(shuffle):
    """An epoch too short for a source's weight to earn it a sample reads none of it, in the whole
    order and the lazy one alike (its count of keys below every threshold is zero)."""
    sources = [Source(0, np.arange(0, 101, 10), 30, True), Source(100, np.array([0, 5]), 30, True)]
    whole = mixed_order(sources, [0.98, 0.02], 12, seed=4, epoch=2, shuffle=shuffle, partitions=2)
    assert len(whole) == 12 and not np.any(whole >= 100) and whole.dtype == np.int64
    lazy = MixedOrder(sources, [0.98, 0.02], 12, 4, 2, shuffle=shuffle, partitions=2)
    assert lazy[:].tolist() == whole.tolist() and lazy.at([11, 0]).tolist() == whole[[11, 0]].tolist()


def test_the_lazy_order_keeps_its_last_chunk_for_the_next_positions(monkeypatch):
    """A rank reads the epoch a batch at a time: positions in the chunk merged last are read from it,
    not drawn again (each batch would otherwise draw a whole chunk of every source)."""
    from cachekit.feed import mixorder

    drawn = []
    real = mixorder._stream
    monkeypatch.setattr(mixorder, "_stream", lambda *a: drawn.append(a[4]) or real(*a))
    monkeypatch.setattr(MixedOrder, "CHUNK", 97)
    sources = [Source(0, np.arange(0, 3001, 7), 30, True), Source(3000, np.arange(0, 2001, 10), 30, True)]
    whole = mixed_order(sources, [0.6, 0.4], 5_003, 7, 2)
    lazy = MixedOrder(sources, [0.6, 0.4], 5_003, 7, 2)
    assert lazy.at([2_500]).tolist() == whole[[2_500]].tolist()
    first = len(drawn)
    assert first > 0
    assert lazy.at([2_500]).tolist() == whole[[2_500]].tolist() and lazy[2_500] == whole[2_500]
    assert len(drawn) == first


def test_a_source_is_as_long_as_its_last_offset_and_caps_the_partitions():
    source = Source(0, np.array([0, 2, 4, 6]), 5, True)
    assert len(source) == 6
    order = mixed_order([source], [1.0], 6, seed=1, epoch=0, partitions=5, shuffle=False)
    assert sorted(order.tolist()) == list(range(6))
    assert MixedOrder([source], [1.0], 6, 1, 0, shuffle=False, partitions=9).partitions == 6  # its 6 samples


def test_a_source_larger_than_a_pass_group_draws_one_pass_at_a_time(monkeypatch):
    """A source of more samples than ``PASS_GROUP_SAMPLES`` draws its passes one at a time (the work
    of an epoch that reads a little of it is one pass, never two)."""
    from cachekit.feed import mixorder

    monkeypatch.setattr(mixorder, "PASS_GROUP_SAMPLES", 50)
    per = []
    real = mixorder._pass_group
    monkeypatch.setattr(mixorder, "_pass_group", lambda *a: per.append(a[5]) or real(*a))
    order = mixed_order(_one_source(12, 5, 10, False), [1.0], 70, seed=3, epoch=0)
    assert sorted(order[:60].tolist()) == list(range(60)) and per == [1, 1]


def test_a_late_epoch_draws_only_the_passes_it_reads(monkeypatch):
    """Epoch 5 of a source read a pass an epoch draws pass 5 alone (no earlier group of passes), and
    without shuffling its order costs one pass of memory, not one per epoch gone by."""
    import tracemalloc

    from cachekit.feed import mixorder

    monkeypatch.setattr(mixorder, "PASS_GROUP_SAMPLES", 1)
    groups = []
    real = mixorder._pass_group
    monkeypatch.setattr(mixorder, "_pass_group", lambda *a: groups.append(a[4]) or real(*a))
    order = mixed_order(_one_source(12, 5, 10, False), [1.0], 60, seed=3, epoch=5)
    assert sorted(order.tolist()) == list(range(60)) and groups == [5]
    tracemalloc.start()
    try:
        late = mixed_order(_one_source(2, 5, 10, False), [1.0], 10, seed=3, epoch=100_000, shuffle=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert late.tolist() == list(range(10)) and peak < 1_000_000


def test_a_window_under_one_sample_is_one_sample():
    assert Source(0, np.array([0, 1, 2]), 0, True).window == 1 and Source(0, np.array([0, 3]), -4, False).window == 1
