"""ShardAwareDistributedSampler in a real torch.distributed (gloo) group, and its resume state."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp_mp

from cachekit import CachedDataset, ShardAwareDistributedSampler


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, cache, drop_last, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ds = CachedDataset(cache)
        sampler = ShardAwareDistributedSampler(ds, seed=3, drop_last=drop_last)  # rank/world from the group
        out = {"len": len(sampler), "rank": sampler.rank, "world": sampler.num_replicas}
        for epoch in (0, 1, 0):
            sampler.set_epoch(epoch)
            out.setdefault("epochs", []).append(list(sampler))
        results[rank] = out
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_in_a_gloo_group_are_disjoint_covering_and_equal(small_cache, world, drop_last):
    n = len(CachedDataset(small_cache))  # 40 samples: divides by 2, not by 3
    manager = tmp_mp.Manager()
    results = manager.dict()
    tmp_mp.spawn(_rank_main, args=(world, _free_port(), str(small_cache), drop_last, results), nprocs=world)
    got = [results[r] for r in range(world)]
    assert [g["rank"] for g in got] == list(range(world)) and {g["world"] for g in got} == {world}
    per_rank = n // world if drop_last else -(-n // world)
    assert {g["len"] for g in got} == {per_rank}
    for e in range(3):
        lists = [g["epochs"][e] for g in got]
        assert all(len(x) == per_rank for x in lists)
        flat = [i for x in lists for i in x]
        if drop_last:
            assert len(set(flat)) == len(flat) == per_rank * world
        else:
            assert set(flat) == set(range(n))
            assert len(flat) - len(set(flat)) == per_rank * world - n  # padding only
            if n % world == 0:
                assert all(not set(a) & set(b) for a in lists for b in lists if a is not b)
    assert got[0]["epochs"][0] == got[0]["epochs"][2]  # same epoch, same order
    assert got[0]["epochs"][0] != got[0]["epochs"][1]  # set_epoch changes it


def test_order_matches_torch_padding_and_is_deterministic(small_cache):
    ds = CachedDataset(small_cache)
    a = ShardAwareDistributedSampler(ds, num_replicas=3, rank=1, seed=5)
    b = ShardAwareDistributedSampler(ds, num_replicas=3, rank=1, seed=5)
    assert list(a) == list(b)
    c = ShardAwareDistributedSampler(ds, num_replicas=3, rank=1, seed=6)
    assert list(a) != list(c)
    unshuffled = [
        list(ShardAwareDistributedSampler(ds, num_replicas=3, rank=r, shuffle=False)) for r in range(3)
    ]
    order = list(range(40)) + [0, 1]  # torch pads by repeating the start of the order
    assert unshuffled == [order[0:14], order[14:28], order[28:42]]


def test_reads_stay_within_a_window_of_shards(small_cache):
    ds = CachedDataset(small_cache)  # 6 shards of 7 samples (the last has 5)
    sampler = ShardAwareDistributedSampler(ds, num_replicas=1, rank=0, seed=1, window=2)
    shards = np.searchsorted(ds.shard_offsets, np.array(list(sampler)), side="right") - 1
    # The order is three windows of two shards each: every window's samples are contiguous.
    windows = [set(shards[i : i + 14].tolist()) for i in range(0, 28, 14)]
    assert all(len(w) == 2 for w in windows)
    assert sorted(shards.tolist()) == sorted(np.repeat(np.arange(6), np.diff(ds.shard_offsets)).tolist())


def test_resume_mid_epoch_yields_exactly_the_rest(small_cache):
    ds = CachedDataset(small_cache)
    sampler = ShardAwareDistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    sampler.set_epoch(4)
    full = list(sampler)
    it = iter(sampler)
    consumed = [next(it) for _ in range(7)]
    state = sampler.state_dict()
    fresh = ShardAwareDistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    fresh.load_state_dict(state)
    assert fresh.epoch == 4 and len(fresh) == len(full) - 7
    rest = list(fresh)
    assert consumed + rest == full
    assert len(fresh) == len(full) and list(fresh) == full  # the next pass is a whole epoch again
    with pytest.raises(ValueError):
        ShardAwareDistributedSampler(ds, num_replicas=3, rank=0, seed=9).load_state_dict(state)
