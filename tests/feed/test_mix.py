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
