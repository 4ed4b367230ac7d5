"""ShardAwareDistributedSampler in a real torch.distributed (gloo) group, and its resume state."""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp_mp
from distgroup import join_group, rendezvous

from cachekit import CachedDataset, ShardAwareDistributedSampler
from cachekit.constants import SHUFFLE_BLOCK_SHARDS, SHUFFLE_WINDOW_SAMPLES


def _rank_main(rank, world, init_method, cache, drop_last, results):
    join_group(rank, world, init_method)
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
def test_ranks_in_a_gloo_group_are_disjoint_covering_and_equal(small_cache, world, drop_last, tmp_path):
    n = len(CachedDataset(small_cache))  # 40 samples: divides by 2, not by 3
    manager = tmp_mp.Manager()
    results = manager.dict()
    tmp_mp.spawn(
        _rank_main, args=(world, rendezvous(tmp_path), str(small_cache), drop_last, results), nprocs=world
    )
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


class FakeCache:
    """Just what the sampler reads: shard offsets, labels per sample and whether shards are mixed."""

    def __init__(self, labels, shard_size: int, mixed: bool, fingerprint: str = "f" * 64) -> None:
        self.labels = np.asarray(labels)
        n = len(self.labels)
        self.shard_offsets = np.array([*range(0, n, shard_size), n], dtype=np.int64)
        self.shards_mixed = mixed
        self.manifest = type("M", (), {"fingerprint": fingerprint})()

    def __len__(self) -> int:
        return len(self.labels)


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
    order = list(range(40)) + [0, 1]  # torch pads by repeating the start, and deals out strided
    assert unshuffled == [order[0::3], order[1::3], order[2::3]]


def test_mixed_caches_read_blocks_of_whole_shards_that_start_small():
    cache = FakeCache(np.arange(400) % 10, shard_size=20, mixed=True)
    sampler = ShardAwareDistributedSampler(cache, num_replicas=1, rank=0, seed=1, window=60)
    order = np.array(list(sampler))
    shards = np.searchsorted(cache.shard_offsets, order, side="right") - 1
    # blocks of whole shards: the ramp holds 1, 1 and 2 shards, then 3 shards (60 samples) a block
    bounds = [0, 20, 40, 80, *range(140, 400, 60), 400]
    blocks = [set(shards[a:b].tolist()) for a, b in zip(bounds, bounds[1:])]
    assert [len(b) for b in blocks] == [1, 1, 2, 3, 3, 3, 3, 3, 1]
    assert all(not (a & b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])  # each shard in one block
    assert sorted(order.tolist()) == list(range(400))
    assert ShardAwareDistributedSampler(cache).window == SHUFFLE_WINDOW_SAMPLES


def test_the_first_batches_need_a_shard_or_two():
    class Remote(FakeCache):
        url = "s3://bucket/cache"

    cache = Remote(np.arange(6400) % 10, shard_size=100, mixed=True)  # 64 shards
    sampler = ShardAwareDistributedSampler(cache, num_replicas=1, rank=0, seed=2)
    assert sampler.window == SHUFFLE_BLOCK_SHARDS * 100  # blocks of a few shards on object storage
    for epoch in range(3):
        sampler.set_epoch(epoch)
        shards = np.searchsorted(cache.shard_offsets, sampler.indices(), side="right") - 1
        assert len(set(shards[:64].tolist())) == 1  # the first batch: one shard
        assert len(set(shards[:200].tolist())) == 2  # the first 200 samples: the minimum, 2 shards
        assert (
            max(len(set(shards[k : k + 64].tolist())) for k in range(0, 6400, 64)) <= 2 * SHUFFLE_BLOCK_SHARDS
        )
    labels = cache.labels[sampler.indices()]
    uniform = np.mean(
        [_distinct_per_batch(cache.labels[np.random.default_rng(s).permutation(6400)], 32) for s in range(3)]
    )
    assert _distinct_per_batch(labels[:64], 32) >= 0.9 * uniform  # a class-mixed shard mixes a batch


def test_class_pure_shards_get_a_uniform_shuffle():
    cache = FakeCache(np.repeat(np.arange(20), 40), shard_size=40, mixed=False)  # one class per shard
    sampler = ShardAwareDistributedSampler(cache, seed=0)
    assert sampler.window == len(cache)  # not known to be mixed: shuffled whole
    mix = _distinct_per_batch(cache.labels[np.array(list(sampler))], 64)
    uniform = np.mean(
        [_distinct_per_batch(cache.labels[np.random.default_rng(s).permutation(800)], 64) for s in range(5)]
    )
    assert mix >= 0.9 * uniform
    narrow = ShardAwareDistributedSampler(cache, seed=0, window=160)  # what a 4-shard window gave
    assert _distinct_per_batch(cache.labels[np.array(list(narrow))], 64) < 0.5 * uniform


def _distinct_per_batch(labels: np.ndarray, batch: int) -> float:
    return float(
        np.mean([len(set(labels[i : i + batch].tolist())) for i in range(0, len(labels) - batch + 1, batch)])
    )


def test_each_pass_is_a_new_epoch_and_set_epoch_wins(small_cache):
    ds = CachedDataset(small_cache)
    sampler = ShardAwareDistributedSampler(ds, num_replicas=2, rank=0, seed=4)
    passes = [list(sampler) for _ in range(3)]
    assert sampler.epoch == 2 and len({tuple(p) for p in passes}) == 3
    for epoch, expected in enumerate(passes):
        sampler.set_epoch(epoch)
        assert list(sampler) == expected
    fixed = ShardAwareDistributedSampler(ds, num_replicas=2, rank=0, seed=4, auto_epoch=False)
    assert list(fixed) == list(fixed) == passes[0]  # torch's behaviour, when asked for


def test_resume_mid_epoch_yields_exactly_the_rest(small_cache):
    ds = CachedDataset(small_cache)
    sampler = ShardAwareDistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    sampler.set_epoch(4)
    full = list(sampler)
    sampler.set_epoch(4)
    it = iter(sampler)
    consumed = [next(it) for _ in range(7)]
    state = sampler.state_dict()
    assert state["position"] == 14 and state["epoch"] == 4
    fresh = ShardAwareDistributedSampler(ds, num_replicas=2, rank=1, seed=9)
    fresh.load_state_dict(state)
    assert fresh.epoch == 4 and len(fresh) == len(full) - 7
    fresh.set_epoch(4)  # the usual loop calls set_epoch first: the resume position is kept
    rest = list(fresh)
    assert consumed + rest == full
    assert list(fresh) != full and fresh.epoch == 5  # the next pass is the next whole epoch
    fresh.set_epoch(4)
    assert list(fresh) == full  # running the epoch again starts it over


@pytest.mark.parametrize("worlds", [(2, 3, 2), (3, 1, 4)])
def test_elastic_resume_consumes_each_remaining_sample_once(small_cache, worlds):
    ds = CachedDataset(small_cache)
    seen: list[int] = []
    state = None
    for step, world in enumerate(worlds):
        ranks = [ShardAwareDistributedSampler(ds, num_replicas=world, rank=r, seed=2) for r in range(world)]
        iters = []
        for s in ranks:
            if state is not None:
                s.load_state_dict(state)
            iters.append(iter(s))
        take = 5 if step < len(worlds) - 1 else len(ranks[0])  # the last job runs to the end
        for it in iters:
            seen += [next(it) for _ in range(take)]
        state = ranks[0].state_dict()
    counts = np.bincount(seen, minlength=len(ds))
    assert counts.min() == 1  # every sample of the epoch, across three differently sized jobs
    assert counts.sum() - len(ds) < worlds[-1]  # repeats only as the last job's padding


def test_state_from_another_cache_or_order_is_refused(small_cache):
    ds = CachedDataset(small_cache)
    sampler = ShardAwareDistributedSampler(ds, seed=1)
    next(iter(sampler))
    state = sampler.state_dict()
    other = FakeCache(np.zeros(len(ds)), 7, mixed=False, fingerprint="0" * 64)
    with pytest.raises(ValueError, match="another cache"):
        ShardAwareDistributedSampler(other, seed=1).load_state_dict(state)
    with pytest.raises(ValueError, match="seed=1"):
        ShardAwareDistributedSampler(ds, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="samples"):
        ShardAwareDistributedSampler(FakeCache(np.zeros(8), 4, False), seed=1).load_state_dict(
            state | {"fingerprint": "f" * 64}  # the same cache, said to be: the length still differs
        )
    with pytest.raises(ValueError, match="version"):
        sampler.load_state_dict({"epoch": 0, "seed": 1, "num_replicas": 1, "consumed": 3})


def test_partitions_keep_each_node_on_its_own_shards_every_epoch(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 3 nodes of 2 ranks
    cache = FakeCache(np.random.default_rng(0).integers(0, 10, 600), shard_size=20, mixed=True)
    world, local = 6, 2
    shards_of_node: list[list[set]] = [[], [], []]
    for epoch in range(3):
        seen = []
        for rank in range(world):
            s = ShardAwareDistributedSampler(
                cache, num_replicas=world, rank=rank, seed=3, partitions=3, window=40
            )
            s.set_epoch(epoch)
            mine = np.array(list(s))
            seen.append(mine)
            shards = set((np.searchsorted(cache.shard_offsets, mine, side="right") - 1).tolist())
            if rank % local == 0:
                shards_of_node[rank // local].append(shards)
            else:
                shards_of_node[rank // local][-1] |= shards
        assert set(np.concatenate(seen).tolist()) == set(range(600))  # still every sample
    for node in shards_of_node:
        assert node[0] == node[1] == node[2]  # the same shards every epoch
    all_sets = [node[0] for node in shards_of_node]
    assert not (all_sets[0] & all_sets[1]) and not (all_sets[1] & all_sets[2])  # and nobody else's
    assert len(set().union(*all_sets)) == 30
    labels = cache.labels[np.array(list(ShardAwareDistributedSampler(cache, 6, 0, seed=3, partitions=3)))]
    assert _distinct_per_batch(labels, 16) > 6  # class-mixed shards: batches stay mixed


def test_partitions_resume_with_another_number_of_nodes(monkeypatch):
    cache = FakeCache(np.arange(500) % 7, shard_size=25, mixed=True)
    seen: list[int] = []
    state = None
    for world, local, take in ((4, 2, 20), (6, 3, 10), (2, 1, None)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        ranks = [ShardAwareDistributedSampler(cache, world, r, seed=1, partitions=2) for r in range(world)]
        for s in ranks:
            if state is not None:
                s.load_state_dict(state)
        iters = [iter(s) for s in ranks]
        count = take if take is not None else len(ranks[0])
        for it in iters:
            seen += [next(it) for _ in range(count)]
        state = ranks[0].state_dict()
    counts = np.bincount(seen, minlength=500)
    assert counts.min() >= 1 and state["partitions"] == 2


def test_a_state_saved_at_the_end_of_an_epoch_resumes_with_the_next():
    cache = FakeCache(np.arange(300) % 10, shard_size=30, mixed=True)
    for drop_last, world in ((False, 1), (True, 4)):  # 300 / 4 / 8: a dropped partial batch at the end
        first = ShardAwareDistributedSampler(cache, world, 0, seed=2, drop_last=drop_last)
        whole = [list(first) for _ in range(3)]  # epochs 0, 1, 2 uninterrupted
        saved = ShardAwareDistributedSampler(cache, world, 0, seed=2, drop_last=drop_last)
        list(saved)
        state = saved.state_dict()
        resumed = ShardAwareDistributedSampler(cache, world, 0, seed=2, drop_last=drop_last)
        resumed.load_state_dict(state)
        assert [list(resumed), list(resumed)] == whole[1:]  # no empty pass, no epoch lost


def test_variants_of_an_input_never_share_a_batch_of_the_spread():
    class Augmented(FakeCache):
        group_size = 3

    cache = Augmented(np.arange(6000) // 3 % 10, shard_size=300, mixed=True)
    for world in (1, 3, 8):
        for batch in (32, 100, 256):
            rank = world - 1
            seq = ShardAwareDistributedSampler(cache, world, rank, seed=1, group_spread=batch).indices()
            inputs = seq // 3
            if len(inputs) // 3 < batch:  # fewer inputs on the rank than a batch: cannot be kept apart
                continue
            batches = [inputs[k : k + batch] for k in range(0, len(inputs), batch)]
            assert all(len(set(b.tolist())) == len(b) for b in batches), (world, batch)
    narrow = ShardAwareDistributedSampler(cache, 1, 0, seed=1, group_spread=64).indices() // 3
    assert any(len(set(narrow[k : k + 256].tolist())) < 256 for k in range(0, len(narrow), 256))


def test_an_object_storage_job_resumes_on_another_number_of_nodes(monkeypatch):
    class Remote(FakeCache):
        url = "s3://bucket/cache"

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cache = Remote(np.arange(600) % 6, shard_size=20, mixed=True)
    old = [ShardAwareDistributedSampler(cache, 4, r, seed=5, window=40) for r in range(4)]  # 2 nodes
    assert old[0].partitions == 2
    used = set()
    for s in old:
        it = iter(s)
        used |= {next(it) for _ in range(30)}
    state = old[0].state_dict(consumed=30)
    for world in (2, 6):  # 1 node, 3 nodes
        new = [ShardAwareDistributedSampler(cache, world, r, seed=5, window=40) for r in range(world)]
        for s in new:
            s.load_state_dict(state)
        rest = np.concatenate([list(s) for s in new])
        assert set(rest.tolist()) == set(range(600)) - used  # each remaining sample, nothing consumed again
        assert len(rest) - len(set(rest.tolist())) < world  # only torch-style padding repeats
        assert all(len(list(s)) == len(s) for s in new)
        assert new[0].partitions == (world // 2 if world // 2 > 1 else 1)  # the next epoch: this job's own


def test_node_partitions_read_every_sample_exactly_once(monkeypatch):
    class Remote(FakeCache):
        url = "s3://bucket/cache"

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for n, shard_size in ((160, 16), (490, 16), (601, 7)):
        cache = Remote(np.arange(n) % 7, shard_size=shard_size, mixed=True)  # partitions of unequal sizes
        for drop_last in (False, True):
            ranks = [ShardAwareDistributedSampler(cache, 8, r, seed=2, drop_last=drop_last) for r in range(8)]
            assert ranks[0].partitions == 4
            nodes = []
            for epoch in range(3):
                dealt = [s.indices(epoch, 0) for s in ranks]
                seen = np.concatenate(dealt)
                counts = np.bincount(seen, minlength=n)
                if drop_last:
                    assert counts.max() == 1 and n - counts.sum() < 8  # at most world - 1 dropped
                else:
                    assert counts.min() == 1 and counts.sum() - n < 8  # at most world - 1 repeated (padding)
                nodes.append([set(np.concatenate(dealt[k : k + 2]).tolist()) for k in range(0, 8, 2)])
            # each node reads its own fixed set every epoch, padding included (drop_last leaves out
            # a few of it, the last in each epoch's order)
            own = [set().union(*(epoch[node] for epoch in nodes)) for node in range(4)]
            assert sum(len(x) for x in own) == len(set().union(*own)) >= n - 8  # no sample on two nodes
            shards_of = [
                set((np.searchsorted(cache.shard_offsets, sorted(x), side="right") - 1).tolist()) for x in own
            ]
            shared = sum(len(a & b) for i, a in enumerate(shards_of) for b in shards_of[i + 1 :])
            assert shared <= 3  # only the shards cut between neighbouring partitions


def test_an_augmented_epoch_saved_at_its_end_resumes_with_the_next_on_any_world():
    class Augmented(FakeCache):
        group_size = 2

    cache = Augmented(np.arange(20) // 2 % 5, shard_size=4, mixed=True)
    for saved_world, new_world in ((3, 2), (4, 1)):
        for drop_last in (False, True):
            old = [
                ShardAwareDistributedSampler(cache, saved_world, r, seed=1, drop_last=drop_last)
                for r in range(saved_world)
            ]
            for s in old:
                list(s)
            state = old[0].state_dict()
            new = ShardAwareDistributedSampler(cache, new_world, 0, seed=1, drop_last=drop_last)
            new.load_state_dict(state)
            ref = ShardAwareDistributedSampler(cache, new_world, 0, seed=1, drop_last=drop_last)
            ref.set_epoch(1)
            assert new.epoch == 1 and list(new) == list(ref)


def test_a_broken_state_is_refused_and_changes_nothing(monkeypatch):
    class Remote(FakeCache):
        url = "s3://bucket/cache"

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    cache = Remote(np.arange(200) % 5, shard_size=10, mixed=True)
    state = ShardAwareDistributedSampler(cache, 4, 0, seed=1).state_dict()  # 2 nodes: 2 partitions
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    sampler = ShardAwareDistributedSampler(cache, 4, 0, seed=1)
    before = list(sampler.indices())
    for broken in ({**state, "epoch": None}, {**state, "num_replicas": "4"}, {**state, "position": 10**9}):
        with pytest.raises(ValueError):
            sampler.load_state_dict(broken)
        assert sampler.partitions == 1 and list(sampler.indices()) == before


@pytest.mark.parametrize(
    "change, words",
    [
        ({"fingerprint": None}, "names no cache"),
        ({"fingerprint": ""}, "names no cache"),
        ("drop-fingerprint", "names no cache"),
        ({"fingerprint": 7}, "names no cache"),
        ({"epoch": -1}, "no valid epoch"),
        ({"epoch": 10**30}, "no valid epoch"),
        ({"epoch": True}, "no valid epoch"),
        ({"epoch": "3"}, "no valid epoch"),
    ],
)
def test_a_state_without_its_cache_or_with_an_absurd_epoch_is_refused_and_changes_nothing(
    small_cache, change, words
):
    ds = CachedDataset(small_cache)
    saver = ShardAwareDistributedSampler(ds, seed=3)
    saver.set_epoch(2)
    it = iter(saver)
    [next(it) for _ in range(5)]
    state = saver.state_dict()
    if change == "drop-fingerprint":
        del state["fingerprint"]
    else:
        state.update(change)
    sampler = ShardAwareDistributedSampler(ds, seed=3)
    sampler.set_epoch(1)
    before = sampler.state_dict()
    with pytest.raises(ValueError, match=words):
        sampler.load_state_dict(state)
    fresh = ShardAwareDistributedSampler(ds, seed=3)
    fresh.set_epoch(1)
    assert sampler.state_dict() == before and list(sampler) == list(fresh)


@pytest.mark.parametrize("epoch", [-1, 2**31, 10**30, 1.5, True])
def test_set_epoch_refuses_what_is_not_an_epoch(small_cache, epoch):
    sampler = ShardAwareDistributedSampler(CachedDataset(small_cache), seed=3)
    with pytest.raises(ValueError, match="epoch must be"):
        sampler.set_epoch(epoch)
    assert sampler.epoch == 0
