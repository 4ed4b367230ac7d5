"""The pin bound: never under what the sampler's batches really touch, and default settings fit at ImageNet scale."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import CachedDataset, UsageError, make_loader, read_manifest
from cachekit.constants import DEFAULT_REMOTE_SHARD_BYTES
from cachekit.feed.order import default_window, node_partitions
from cachekit.feed.sampler import ShardAwareDistributedSampler
from cachekit.stream.pins import shards_per_batch
from cachekit.stream.shardcache import DEFAULT_LOCAL_CACHE_BYTES


class RemoteCache:
    """What the sampler reads of a class-mixed cache on object storage: shard offsets, and the url."""

    url = "s3://bucket/cache"
    shards_mixed = True

    def __init__(self, counts) -> None:
        self.shard_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])


def _hash_buckets(samples: int, shards: int, seed: int = 0) -> np.ndarray:
    """Shard sizes of a shuffled build: inputs spread over the shards by a hash."""
    return np.random.default_rng(seed).multinomial(samples, np.full(shards, 1 / shards))


def test_default_settings_fit_at_imagenet_scale():
    # ImageNet-1k as pixels at 224x224 in the default remote shards (32 MB), one node of 8 ranks
    # reading batches of 256 in-process, the default 20 GB node cache
    sample_bytes = 3 * 224 * 224
    per_shard = DEFAULT_REMOTE_SHARD_BYTES // sample_bytes
    counts = _hash_buckets(1_281_167, -(-1_281_167 // per_shard))
    cache = RemoteCache(counts)
    largest = int(counts.max()) * sample_bytes
    for nodes in (1, 8):
        world = 8 * nodes
        partitions = node_partitions(cache, world, 8)
        window = default_window(cache, len(cache))
        touched = shards_per_batch(cache.shard_offsets, 256, window, world=world, partitions=partitions)
        need = touched * largest * 8  # 8 reading processes on the node, each its batch's shards
        assert need <= DEFAULT_LOCAL_CACHE_BYTES, (nodes, touched, need)
        assert touched < 256 // 4  # a few blocks of 8 shards, not a shard a sample
    old = min(256, len(counts))  # what the old estimate said: a shard for every sample of the batch
    assert old * largest * 8 > DEFAULT_LOCAL_CACHE_BYTES  # and why it refused these defaults


@pytest.mark.parametrize("world,local", [(1, 1), (4, 4), (4, 2), (6, 2), (8, 2)])
def test_the_bound_holds_for_every_batch_of_every_rank(monkeypatch, world, local):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    for samples, shards, window, batch in (
        (3000, 30, None, 16),
        (2000, 40, 120, 24),
        (1000, 9, 50, 40),
        (20000, 100, None, 64),
    ):
        cache = RemoteCache(_hash_buckets(samples, shards, seed=samples))
        ranks = [ShardAwareDistributedSampler(cache, world, r, seed=1, window=window) for r in range(world)]
        bound = shards_per_batch(
            cache.shard_offsets, batch, ranks[0].window, world=world, partitions=ranks[0].partitions
        )
        most = 0
        for epoch in range(4):
            for sampler in ranks:
                shards_read = (
                    np.searchsorted(cache.shard_offsets, sampler.indices(epoch, 0), side="right") - 1
                )
                for k in range(0, len(shards_read), batch):
                    most = max(most, len(set(shards_read[k : k + batch].tolist())))
        assert most <= bound, (samples, world, local, most, bound)
        assert bound <= 2 * most + 4  # and close to it, not a shard a sample


def test_a_loader_that_fits_is_accepted_and_reads_within_the_limit(
    s3_endpoint, small_cache, tmp_path, monkeypatch
):
    import s3fs

    s3fs.S3FileSystem(anon=False).put(str(small_cache) + "/", "datasets/pins", recursive=True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 ranks a node, 2 workers each: 4 reading processes
    largest = max(s.bytes for s in read_manifest(small_cache).shards)
    ds = CachedDataset("s3://datasets/pins", local_cache=tmp_path / "lc", local_cache_bytes=10 * largest)
    # blocks of one 7-sample shard: a batch of 4 touches 2 shards at most, 8 on the node, not 16
    loader = make_loader(ds, 4, window=7, workers=2)
    assert sorted(int(y) for _, labels in loader for y in labels) == sorted(
        CachedDataset(small_cache).read_batch(range(40))[1].tolist()
    )
    with pytest.raises(UsageError, match="shards at once"):
        make_loader(ds, 8, workers=2)  # class-sorted shards shuffled whole: 6 shards a batch, 24 > 10


@pytest.mark.parametrize("world,local", [(1, 1), (4, 2), (6, 2)])
def test_the_bytes_bound_holds_for_every_batch_of_every_rank(monkeypatch, world, local):
    """``bytes_per_batch``: never under the bytes of the shards a real batch touches, with shards of
    unequal sizes (a small one among large ones, each with a fixed overhead)."""
    from cachekit.stream.pins import bytes_per_batch

    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
    for counts, window, batch in (
        (np.array([40, 40, 40, 7, 40, 3]), 40, 16),
        (_hash_buckets(600, 12, seed=3), None, 24),
        (np.array([30, 30, 30, 30, 9]), 30, 32),
    ):
        cache = RemoteCache(counts)
        sizes = counts * 900 + 4000
        ranks = [ShardAwareDistributedSampler(cache, world, r, seed=2, window=window) for r in range(world)]
        bound = bytes_per_batch(
            cache.shard_offsets, sizes, batch, ranks[0].window, world=world, partitions=ranks[0].partitions
        )
        assert bound <= shards_per_batch(
            cache.shard_offsets, batch, ranks[0].window, world=world, partitions=ranks[0].partitions
        ) * int(sizes.max())  # never over the count at the largest size
        for epoch in range(4):
            for sampler in ranks:
                shard_of = np.searchsorted(cache.shard_offsets, sampler.indices(epoch, 0), side="right") - 1
                for k in range(0, len(shard_of), batch):
                    touched = np.unique(shard_of[k : k + batch])
                    assert int(sizes[touched].sum()) <= bound, (counts, epoch, touched, bound)


@pytest.mark.parametrize(
    "shard_size, batch, counts, window",
    [
        (18, 16, [18, 18, 4], 40),  # shuffled whole: a batch needs two large shards and the small one
        (10, 8, [10, 10, 10, 10], 10),  # shuffled whole needs 4 shards: blocks shrink to one shard
    ],
)
def test_a_limit_of_two_and_a_half_shards_is_met_before_it_is_refused(
    s3_endpoint, small_tree, tmp_path, shard_size, batch, counts, window
):
    """A class-sorted cache in path order (shuffled whole by default), a node cache of 2.5 shards:
    the bound counts a small shard at its own bytes, and blocks shrink to what the limit allows."""
    import s3fs

    from cachekit import BuildConfig, build

    config = BuildConfig(size=16, shard_size=shard_size, order="sorted", workers=1, progress=False)
    build(small_tree, tmp_path / "c", config)
    manifest = read_manifest(tmp_path / "c")
    assert [s.samples for s in manifest.shards] == counts
    s3fs.S3FileSystem(anon=False).put(str(tmp_path / "c") + "/", f"datasets/tight{batch}", recursive=True)
    largest = max(s.bytes for s in manifest.shards)
    url = f"s3://datasets/tight{batch}"
    ds = CachedDataset(url, local_cache=tmp_path / "lc", local_cache_bytes=int(2.5 * largest))
    loader = make_loader(ds, batch, seed=1)
    assert loader.sampler.window == window
    labels = sorted(int(y) for _ in range(2) for _, got in loader for y in got)
    assert labels == sorted(CachedDataset(tmp_path / "c").read_batch(range(40))[1].tolist() * 2)
    with pytest.raises(UsageError, match="shards at once"):  # what cannot fit is still refused
        make_loader(
            CachedDataset(url, local_cache=tmp_path / "lc2", local_cache_bytes=int(1.5 * largest)), batch
        )
