"""cachekit.mix: caches drawn by weight, with the sampler's guarantees (deterministic, resumable, distributed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cachekit import (
    BuildConfig,
    CachedDataset,
    ShardAwareDistributedSampler,
    UsageError,
    build,
    make_loader,
    mix,
)
from cachekit.feed.mixorder import Source, mixed_order
from cachekit.tools.synthetic import make_synthetic_folder


@pytest.fixture(scope="module")
def two_caches(tmp_path_factory) -> tuple:
    """A: 60 samples of 3 classes in shards of 10; B: 40 samples of 2 classes in shards of 8; one recipe."""
    root = tmp_path_factory.mktemp("mix")
    out = []
    for name, n, classes, shard in (("a", 60, 3, 10), ("b", 40, 2, 8)):
        raw = make_synthetic_folder(
            root / f"raw-{name}", n, classes=classes, size=(30, 30), seed=len(name) + n
        )
        build(raw, root / name, BuildConfig(size=24, shard_size=shard, workers=1, progress=False))
        out.append(root / name)
    return tuple(out)


def _sources(*sizes, shard=100, window=400) -> list[Source]:
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [
        Source(start, np.array([*range(0, n, shard), n], dtype=np.int64), window, True)
        for start, n in zip(starts[:-1].tolist(), sizes)
    ]


def test_each_source_gets_its_weight_over_100k_draws_and_in_every_stretch():
    sources = _sources(30_000, 5_000)
    order = mixed_order(sources, [0.7, 0.3], 100_000, seed=1, epoch=0)
    which = (order >= 30_000).astype(int)
    assert len(order) == 100_000
    assert abs(which.mean() - 0.3) < 0.003  # within 1% of the weight
    per_batch = which[: 100_000 // 64 * 64].reshape(-1, 64).sum(1)
    assert per_batch.min() >= 0.3 * 64 - 3 and per_batch.max() <= 0.3 * 64 + 3  # every batch mixed too


def test_each_source_is_read_without_replacement_within_a_pass():
    sources = _sources(3_000, 500)
    draws = {0: [], 1: []}
    for epoch in range(4):  # 2,800 a (0.93 of a pass) and 1,200 b (2.4 passes) an epoch
        order = mixed_order(sources, [0.7, 0.3], 4_000, seed=3, epoch=epoch)
        draws[0] += order[order < 3_000].tolist()
        draws[1] += (order[order >= 3_000] - 3_000).tolist()
    for n, got in ((3_000, draws[0]), (500, draws[1])):
        for k in range(0, len(got) - n + 1, n):  # each pass: every sample exactly once
            assert sorted(got[k : k + n]) == list(range(n))
    again = mixed_order(sources, [0.7, 0.3], 4_000, seed=3, epoch=3)
    assert np.array_equal(again, order) and not np.array_equal(
        order, mixed_order(sources, [0.7, 0.3], 4_000, 3, 2)
    )


def test_node_partitions_of_every_source_stay_on_their_node():
    sources = _sources(2_000, 900, shard=50)
    nodes = [set(), set()]
    for epoch in range(3):
        order = mixed_order(sources, [0.5, 0.5], 2_000, seed=2, epoch=epoch, partitions=2)
        for q in range(2):
            nodes[q] |= set(order[q::2].tolist())
    assert not nodes[0] & nodes[1]  # position p comes from partition p % 2: a node's samples are its own
    assert len(nodes[0]) + len(nodes[1]) <= 2_900


def test_a_mixed_loader_reads_local_and_s3_caches_with_classes_apart(two_caches, s3_endpoint, tmp_path):
    import s3fs

    a, b = two_caches
    s3fs.S3FileSystem(anon=False).put(str(b) + "/", "datasets/mix-b", recursive=True)
    local_a, remote_b = CachedDataset(a), CachedDataset("s3://datasets/mix-b", local_cache=tmp_path / "lc")
    mixed = mix([local_a, remote_b], weights=[0.5, 0.5], samples_per_epoch=80)
    assert mixed.classes == local_a.classes + remote_b.classes and mixed.class_offsets == [0, 3]
    loader = make_loader(mixed, 8, seed=1)
    seen_images, seen_labels = [], []
    for images, labels in loader:
        seen_images.append(images)
        seen_labels.append(labels)
    images, labels = torch.cat(seen_images), torch.cat(seen_labels)
    order = torch.from_numpy(loader.sampler.last_indices)
    assert len(labels) == 80 and int((order >= 60).sum()) == 40  # 40 of each
    from_b = order >= 60
    want_a = CachedDataset(a).read_batch(order[~from_b].numpy())
    want_b = CachedDataset(b).read_batch((order[from_b] - 60).numpy())
    assert torch.equal(images[~from_b], want_a[0]) and torch.equal(labels[~from_b], want_a[1])
    assert torch.equal(images[from_b], want_b[0]) and torch.equal(labels[from_b], want_b[1] + 3)
    assert len(set(order[from_b].tolist())) == 40  # all of b once: its first pass
    workers = make_loader(mixed, 8, seed=1, workers=2)  # the mix pickles to worker processes
    assert torch.equal(torch.cat([y for _, y in workers]), labels)


def test_a_mixed_loader_resumes_mid_epoch_on_another_world_size(two_caches):
    mixed = mix([CachedDataset(p) for p in two_caches], weights=[0.7, 0.3])
    loader = make_loader(mixed, 4, seed=5)
    it = iter(loader)
    for _ in range(6):
        next(it)
    state = loader.state_dict()
    assert state["position"] == 24 and state["window"] == mixed.windows
    epoch = ShardAwareDistributedSampler(mixed, 1, 0, seed=5).order(0)
    for world in (2, 3):
        ranks = [ShardAwareDistributedSampler(mixed, world, r, seed=5) for r in range(world)]
        for s in ranks:
            s.load_state_dict(state)
        rest = np.concatenate([list(s) for s in ranks])
        counts = np.bincount(rest, minlength=len(mixed))
        expected = np.bincount(epoch[24:], minlength=len(mixed))
        assert (counts >= expected).all() and counts.sum() - expected.sum() < world  # padding only
    with pytest.raises(ValueError, match="another cache"):
        other = mix([CachedDataset(p) for p in two_caches], weights=[0.5, 0.5])
        ShardAwareDistributedSampler(other, 1, 0, seed=5).load_state_dict(state)


def test_mixing_what_cannot_be_one_batch_is_refused(two_caches, small_cache):
    a, b = (CachedDataset(p) for p in two_caches)
    with pytest.raises(UsageError, match="sample layout"):
        mix([a, CachedDataset(small_cache)])  # 32x32 samples with 24x24 ones
    for weights in ([1.0], [-1, 2], [0, 0], [float("nan"), 1]):
        with pytest.raises(UsageError, match="weights"):
            mix([a, b], weights=weights)
    assert mix([a, b]).weights == [0.5, 0.5] and mix([a, b]).epoch_len == 100


def test_an_epoch_of_a_small_source_costs_its_samples_not_its_passes(monkeypatch):
    """A 3-sample source drawn 150,000 times an epoch: its passes come many at a time, so the
    generators made are a handful (one a pass before: 50,000), and each pass is still every sample once."""
    made = []
    real = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda *a, **k: made.append(a) or real(*a, **k))
    sources = _sources(3, 2_000, shard=1, window=2)
    order = mixed_order(sources, [0.75, 0.25], 200_000, seed=4, epoch=1)
    assert len(order) == 200_000 and len(made) <= 12, len(made)
    small = order[order < 3]
    assert len(small) == 150_000
    passes = np.sort(small.reshape(-1, 3), axis=1)
    assert (passes == np.arange(3)).all()
    big = order[order >= 3] - 3
    assert len(big) == 50_000 and all(
        sorted(big[k : k + 2000]) == list(range(2000)) for k in range(0, 48_000, 2000)
    )


@pytest.mark.parametrize("n", [0, -1, 2**28 + 1, 10**12, 10**30, 2.5, True, "100"])
def test_samples_per_epoch_is_bounded_in_one_line(two_caches, n):
    a, b = (CachedDataset(p) for p in two_caches)
    with pytest.raises(
        UsageError, match="samples_per_epoch must be a whole number from 1 to 268435456"
    ) as err:
        mix([a, b], samples_per_epoch=n)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_the_largest_epoch_is_accepted_without_building_its_order(two_caches):
    a, b = (CachedDataset(p) for p in two_caches)
    mixed = mix([a, b], samples_per_epoch=2**28)
    sampler = ShardAwareDistributedSampler(mixed, 4, 1, seed=0)  # the length alone: no order of 2**28 made
    assert len(sampler) == 2**26 and mixed.draws_per_epoch() == [2**27, 2**27]


@pytest.mark.parametrize("weights", [[1e308, 1e308], [float("inf"), 1], [1.7e308, 1e308]])
def test_weights_whose_sum_overflows_are_refused(two_caches, weights):
    a, b = (CachedDataset(p) for p in two_caches)
    with pytest.raises(UsageError, match="whose sum is a finite number"):
        mix([a, b], weights=weights)
    assert mix([a, b], weights=[1e307, 1e307]).weights == [0.5, 0.5]


def test_mixing_a_fixed_size_and_a_variable_size_cache_says_what_differs(two_caches, tmp_path):
    raw = make_synthetic_folder(tmp_path / "raw", 8, classes=2, size=(30, 26), seed=1)
    build(raw, tmp_path / "own", BuildConfig(pipeline="none", shard_size=4, workers=1, progress=False))
    fixed, own = CachedDataset(two_caches[0]), CachedDataset(tmp_path / "own")
    assert own.ragged
    with pytest.raises(UsageError, match="their samples differ") as err:
        mix([fixed, own])
    message = str(err.value)
    assert "fixed-size 3x24x24" in message and "variable-size" in message and "\n" not in message


def test_each_source_gets_its_weights_share_of_a_loaders_epoch(two_caches):
    """Counted over what a loader hands out, not only through the resume fingerprint."""
    a, b = (CachedDataset(p) for p in two_caches)
    for weights, want in (([0.8, 0.2], (800, 200)), ([0.25, 0.75], (250, 750))):
        mixed = mix([a, b], weights=weights, samples_per_epoch=1000)
        loader = make_loader(mixed, 50, seed=3)
        labels = torch.cat([y for _, y in loader])
        from_a = int((labels < len(a.classes)).sum())
        assert (from_a, len(labels) - from_a) == want


def test_a_large_source_read_a_little_an_epoch_draws_its_pass_once(two_caches, monkeypatch):
    """A pass of the large source spans many epochs: drawn once, kept, never again each epoch; the
    orders are those of a mix that keeps nothing."""
    from cachekit.feed import mixorder

    drawn = []
    real = mixorder._pass_group
    monkeypatch.setattr(mixorder, "_pass_group", lambda *a: drawn.append(a[4]) or real(*a))
    a, b = (CachedDataset(p) for p in two_caches)
    mixed = mix([a, b], weights=[0.05, 0.95], samples_per_epoch=40)  # 2 of a's 60 an epoch
    sampler = ShardAwareDistributedSampler(mixed, 1, 0, seed=2)
    orders = []
    for epoch in range(6):
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    assert len(drawn) == 2, drawn  # one group of passes per source in 6 epochs (kept nothing: 12)
    fresh = [
        mixed_order(
            [Source(s, ds.shard_offsets, w, True) for ds, s, w in zip(mixed.sources, mixed.starts[:-1].tolist(), mixed.windows)],
            mixed.weights, 40, 2, e,
        ).tolist()
        for e in range(6)
    ]  # fmt: skip
    assert orders == fresh


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("partitions", [1, 3])
def test_the_order_at_any_positions_is_the_whole_orders(shuffle, partitions, monkeypatch):
    from cachekit.feed.mixorder import MixedOrder

    monkeypatch.setattr(MixedOrder, "CHUNK", 97)  # many chunks, cut anywhere
    rng = np.random.default_rng(1)
    for sizes, weights, n in (((60, 40), [0.7, 0.3], 1_000), ((3, 2_000, 10), [0.2, 0.5, 0.3], 5_003),
                              ((500,), [1.0], 777)):  # fmt: skip
        for seed, epoch in ((0, 0), (7, 3)):
            sources = _sources(*sizes, shard=7, window=30)
            whole = mixed_order(sources, weights, n, seed, epoch, shuffle, partitions)
            lazy = MixedOrder(sources, weights, n, seed, epoch, shuffle, partitions)
            assert len(lazy) == n and np.array_equal(lazy[np.arange(n)], whole)
            for positions in (rng.permutation(n)[:300], np.arange(n - 5, n), np.arange(2, n, 4)):
                fresh = MixedOrder(sources, weights, n, seed, epoch, shuffle, partitions, {})
                assert np.array_equal(fresh[positions], whole[positions])
            assert np.array_equal(lazy[5:40], whole[5:40]) and lazy[n - 1] == whole[n - 1]


def test_a_rank_reads_its_share_of_the_mix_as_dealt_from_the_whole_order(two_caches):
    mixed = mix([CachedDataset(p) for p in two_caches], weights=[0.6, 0.4], samples_per_epoch=250)
    sources = [Source(s, ds.shard_offsets, w, True) for ds, s, w in zip(mixed.sources, mixed.starts[:-1].tolist(), mixed.windows)]  # fmt: skip
    for epoch in (0, 2):
        whole = mixed_order(sources, mixed.weights, 250, 4, epoch)
        for world in (1, 3):
            for rank in range(world):
                sampler = ShardAwareDistributedSampler(mixed, world, rank, seed=4)
                sampler.set_epoch(epoch)
                per = -(-250 // world)  # 84 on 3 ranks: padded from the start of the order, as torch pads
                got = list(sampler)
                assert got == whole[[p % 250 for p in range(rank, per * world, world)]].tolist()
                share = sampler.last_indices  # handed out a page at a time, never made whole
                assert np.array_equal(np.asarray(share), got) and share.tolist() == got and len(share) == len(got)
                assert share[3:10].tolist() == got[3:10] and np.asarray(share, dtype=np.int32).dtype == np.int32
                with pytest.raises(TypeError):
                    share[0]


def test_an_epoch_of_100_million_mixed_samples_costs_a_few_mb(two_caches):
    """The order of a mix is evaluated in the rank's share, a chunk at a time: building the mix and
    reading its first batch take the same few MB for an epoch of 10**8 samples as for 10**3
    (the whole order made first took 5.8 GB and 10 s before the first batch)."""
    import tracemalloc

    a, b = (CachedDataset(p) for p in two_caches)
    peaks = []
    for n in (1_000, 10**8):
        tracemalloc.start()
        try:
            loader = make_loader(mix([a, b], weights=[0.7, 0.3], samples_per_epoch=n), 8, seed=3)
            images, labels = next(iter(loader))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert len(loader.sampler) == n and images.shape[0] == 8
        del loader
    assert peaks[1] < 16 * 2**20 and peaks[1] < peaks[0] + 8 * 2**20, peaks
