"""The epoch order computed in each rank's own share: the same as the whole order's dealing, and
the sampler's properties (disjoint, covering, equal, resumable, elastic, node-stable) over many
world sizes and partitions; a rank of a billion-sample epoch in a few megabytes."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

import numpy as np
import pytest

from cachekit import ShardAwareDistributedSampler
from cachekit.feed.order import PieceOrder, block_bounds, epoch_order, partition_pieces, units_at
from cachekit.feed.permute import permute


def _cache(counts, mixed=True) -> SimpleNamespace:
    """A dataset as the sampler sees it: shard offsets (and whether shards are class-mixed)."""
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return SimpleNamespace(shard_offsets=offsets, shards_mixed=mixed, url=None, __len__=lambda: offsets[-1])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 17, 255, 256, 1000, 4097])
def test_permute_is_a_permutation_per_key(n):
    got = [permute(np.arange(n), n, key) for key in (0, 1, 2**63 + 5)]
    assert all(sorted(g.tolist()) == list(range(n)) for g in got)
    if n > 16:  # different keys, different orders; not the identity
        assert not np.array_equal(got[0], got[1]) and not np.array_equal(got[0], np.arange(n))
    with pytest.raises(ValueError):
        permute(np.array([n]), n, 0)


def test_permute_spreads_positions_evenly():
    n, trials = 10, 4000  # each position lands on each place about equally often
    hits = np.zeros((n, n), dtype=np.int64)
    for key in range(trials):
        hits[np.arange(n), permute(np.arange(n), n, key)] += 1
    expected = trials / n
    assert np.abs(hits - expected).max() < 0.25 * expected


def test_blocks_are_greedy_with_a_ramp():
    units = np.array([5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5], dtype=np.int64)
    assert block_bounds(units, 15, ramp=True).tolist() == [0, 1, 2, 4, 7, 10, 12]  # 1, 1, 2, 3, 3, 2
    assert block_bounds(units, 15, ramp=False).tolist() == [0, 3, 6, 9, 12]
    assert block_bounds(np.array([40, 1, 1]), 15, ramp=False).tolist() == [0, 1, 3]  # a piece past span alone
    assert block_bounds(np.zeros(0, dtype=np.int64), 15, ramp=True).tolist() == [0]


def test_a_piece_order_shuffles_within_blocks_only():
    first, units = np.array([0, 10, 20, 30]), np.array([10, 10, 10, 10])
    order = PieceOrder(first, units, np.random.default_rng(3), span=20, ramp=False)
    whole = order.at(np.arange(40))
    assert sorted(whole.tolist()) == list(range(40))
    for lo, hi in zip(order.block_start[:-1], order.block_start[1:]):
        shards = set((whole[lo:hi] // 10).tolist())
        assert len(shards) == 2  # a block is two whole shards, all of their samples
    assert np.array_equal(order.at(np.array([39, 0, 17])), whole[[39, 0, 17]])


@pytest.mark.parametrize("partitions", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("window", [None, 7, 40])
def test_units_at_any_positions_is_the_whole_orders(partitions, window):
    rng = np.random.default_rng(partitions * 100 + (window or 0))
    counts = rng.integers(0, 30, 25)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    for epoch in (0, 1, 9):
        whole = epoch_order(offsets, 11, epoch, True, window, 1, partitions, ramp=window is not None)
        assert sorted(whole.tolist()) == list(range(int(offsets[-1])))
        pos = np.sort(rng.choice(len(whole), size=40, replace=False))
        assert np.array_equal(
            units_at(offsets, 11, epoch, pos, True, window, 1, partitions, window is not None), whole[pos]
        )


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_partition_pieces_alone_match_all_of_them(partitions):
    counts = np.array([0, 7, 3, 12, 0, 9, 1, 20, 5], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    every = partition_pieces(starts, counts, partitions, seed=4)
    for q, (first, units) in enumerate(every):
        ((f, u),) = partition_pieces(starts, counts, partitions, seed=4, only=q)
        assert np.array_equal(f, first) and np.array_equal(u, units)
    assert sum(int(u.sum()) for _, u in every) == int(counts.sum())


def _epoch(samplers, epoch):
    for s in samplers:
        s.set_epoch(epoch)
    return [s.indices() for s in samplers]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 7, 8, 12, 16])
@pytest.mark.parametrize("partitions", [1, 2, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_disjoint_covering_equal_over_world_sizes(world, partitions, drop_last, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(max(1, world // partitions)))
    rng = np.random.default_rng(world * 10 + partitions)
    ds = _cache(rng.integers(1, 25, 30))
    n = int(ds.shard_offsets[-1])
    samplers = [
        ShardAwareDistributedSampler(
            ds, world, r, seed=5, drop_last=drop_last, partitions=partitions, window=30
        )
        for r in range(world)
    ]
    per = n // world if drop_last else -(-n // world)
    for epoch in (0, 3):
        got = _epoch(samplers, epoch)
        assert {len(g) for g in got} == {per}
        flat = np.concatenate(got)
        if drop_last:
            assert len(set(flat.tolist())) == len(flat)  # disjoint
        else:
            assert set(flat.tolist()) == set(range(n))  # covering, padded only
            assert len(flat) - n == per * world - n
        whole = samplers[0].order(epoch)  # the same as dealing out the whole order
        assert set(flat.tolist()) <= set(whole.tolist())
        if world % partitions == 0 and partitions > 1 and not drop_last:
            parts = partition_pieces(ds.shard_offsets[:-1], np.diff(ds.shard_offsets), partitions, 5)
            owner = np.empty(n, dtype=np.int64)
            for q, (first, units) in enumerate(parts):
                for a, u in zip(first.tolist(), units.tolist()):
                    owner[a : a + u] = q
            for g in got:  # node-stable: each rank reads one partition's samples, padding included
                assert len(set(owner[g].tolist())) == 1


@pytest.mark.parametrize("world,later", [(4, 4), (4, 3), (3, 8), (8, 5), (6, 1)])
@pytest.mark.parametrize("partitions", [1, 2])
def test_resume_elastic_consumes_each_remaining_sample_once(world, later, partitions):
    ds = _cache(np.full(24, 13))
    n = int(ds.shard_offsets[-1])
    first = [ShardAwareDistributedSampler(ds, world, r, seed=2, partitions=partitions) for r in range(world)]
    consumed = 17
    seen = []
    for s in first:
        s.set_epoch(1)
        it = iter(s)
        seen += [next(it) for _ in range(consumed)]
    state = first[0].state_dict()
    assert state["position"] == consumed * world
    rest = []
    for r in range(later):
        s = ShardAwareDistributedSampler(ds, later, r, seed=2, partitions=partitions)
        s.load_state_dict(state)
        rest.append(list(s))
    left = [i for r in rest for i in r]
    remaining = set(range(n)) - set(seen)
    assert len(remaining) == n - consumed * world
    assert remaining <= set(left)  # every remaining sample, once, plus padding from the order's start
    assert len(left) - len(remaining) < later and len(set(left) - set(seen)) == len(remaining)


def test_variants_dealt_per_rank_match_the_whole_order():
    ds = _cache(np.full(10, 12))
    ds.group_size = 3
    for world in (1, 2, 3, 5):
        samplers = [ShardAwareDistributedSampler(ds, world, r, seed=1, group_spread=4) for r in range(world)]
        got = _epoch(samplers, 2)
        units = samplers[0].order(2)
        for r, g in enumerate(got):  # whole inputs per rank, from its positions of the order
            mine = set((g // 3).tolist())
            assert mine <= set(units[r::world].tolist()) | set(units[: len(g)].tolist())
        assert set(np.concatenate(got).tolist()) == set(range(120))
        state = samplers[0].state_dict()
        again = ShardAwareDistributedSampler(ds, world, 0, seed=1, group_spread=4)
        again.load_state_dict(state | {"position": world * 6})
        assert np.array_equal(again.indices(), got[0][6:])


def test_a_rank_of_a_billion_samples_is_computed_in_its_share():
    """One rank of 100,000 over 10**9 samples in 10**5 shards: the whole order would be 8 GB."""
    ds = _cache(np.full(100_000, 10_000))
    tracemalloc.start()
    sampler = ShardAwareDistributedSampler(ds, 100_000, 77, seed=9, partitions=1)
    mine = sampler.indices()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(mine) == 10_000 and len(set(mine.tolist())) == 10_000
    assert peak < 40 * 2**20  # the rank's share and a few numbers per shard, never 10**9 of anything
    window = sampler.window
    assert (np.ptp(mine // 10_000) + 1) * 10_000 >= window  # drawn across blocks, not one shard


def test_every_block_of_an_epoch_is_shuffled_by_its_own_key():
    # one shard of 64 samples a block (no ramp): a block's pattern is where each of its shard's
    # samples lands in it; blocks sharing a key would share their pattern, epochs sharing keys theirs
    offsets = np.arange(0, 64 * 9, 64, dtype=np.int64)
    patterns = {}
    for epoch in (0, 1):
        order = epoch_order(offsets, seed=5, epoch=epoch, window=64, ramp=False)
        for b in range(8):
            block = order[b * 64 : (b + 1) * 64]
            assert len(set((block // 64).tolist())) == 1  # one whole shard
            patterns[epoch, b] = tuple((block - block.min()).tolist())
    assert len(set(patterns.values())) == 16  # every block of both epochs its own permutation
    # and independent: sample k's place in one block says nothing of its place in the next
    places = np.array([np.argsort(patterns[0, b]) for b in range(8)])
    same = (places[:-1] == places[1:]).mean()
    assert same < 0.1  # 1/64 expected; a reused key gives 1
