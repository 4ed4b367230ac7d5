"""A mosaic over a cache on object storage takes its extra samples from the shards its batch reads.

Drawn over the whole dataset, three extras a sample pinned and downloaded up to three more shards
a sample: a node cache sized for the loader's own batches (which ``make_loader`` accepts) failed
at the first batch. A local cache keeps drawing from the whole dataset.
"""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, make_loader, mix, read_manifest
from cachekit.augment.plan import compile_plan
from cachekit.errors import UsageError
from cachekit.feed.assemble import BatchRequest
from cachekit.feed.rows import read_indices
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import Mosaic, RandomHorizontalFlip

RECIPE = [Mosaic(32), RandomHorizontalFlip()]


@pytest.fixture(scope="module")
def detect_cache(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mosaic-remote")
    raw = make_object_dataset(tmp / "raw", 40, size=(40, 56), classes=3)
    config = BuildConfig(annotations="yolo", pipeline="none", shard_size=5, workers=1, progress=False)
    build(raw, tmp / "c", config)
    return tmp / "c"


def _shards(ds, indices) -> set[int]:
    return set((np.searchsorted(ds.shard_offsets, np.asarray(indices), side="right") - 1).tolist())


def test_extras_come_from_the_batchs_shards_and_a_tight_node_cache_reads_every_epoch(
    s3_endpoint, detect_cache, tmp_path
):
    import s3fs

    s3fs.S3FileSystem(anon=False).put(str(detect_cache) + "/", "datasets/mosaic", recursive=True)
    largest = max(s.bytes for s in read_manifest(detect_cache).shards)
    ds = CachedDataset(
        "s3://datasets/mosaic", local_cache=tmp_path / "lc", local_cache_bytes=int(2.5 * largest)
    )
    plan = compile_plan(RECIPE)
    for start in range(0, 40, 4):
        own = list(range(start, start + 4))
        request = BatchRequest(own, seed=1, epoch=0, plan=plan)
        read = read_indices(request, ds)
        assert len(read) == 16 and read[:4] == own
        assert _shards(ds, read) == _shards(ds, own)  # no shard pinned for the extras alone
    loader = make_loader(ds, 4, seed=1, augment=RECIPE, window=5)
    for epoch in range(2):
        seen = sum(len(images) for images, _ in loader)
        assert seen == 40, epoch
    local = CachedDataset(detect_cache)  # a local cache: extras from anywhere
    reads = [
        read_indices(BatchRequest(list(range(s, s + 4)), seed=1, plan=plan), local) for s in range(0, 40, 4)
    ]
    assert any(not _shards(local, r) <= _shards(local, r[:4]) for r in reads)


def test_a_mix_with_a_source_on_object_storage_draws_from_each_batchs_shards(
    s3_endpoint, small_cache, tmp_path
):
    import s3fs

    s3fs.S3FileSystem(anon=False).put(str(small_cache) + "/", "datasets/mosaic-mix", recursive=True)
    largest = max(s.bytes for s in read_manifest(small_cache).shards)
    remote = CachedDataset(
        "s3://datasets/mosaic-mix", local_cache=tmp_path / "lc", local_cache_bytes=int(3.5 * largest)
    )
    both = mix([remote, CachedDataset(small_cache)])
    plan = compile_plan(RECIPE)
    for start in range(0, 80, 8):
        own = list(range(start, start + 8))
        read = np.asarray(read_indices(BatchRequest(own, seed=2, plan=plan), both))
        which = np.searchsorted(both.starts, read, side="right") - 1
        for i in np.unique(which).tolist():
            source = both.sources[i]
            mine = [k - both.starts[i] for k in own if both.starts[i] <= k < both.starts[i + 1]]
            assert _shards(source, read[which == i] - both.starts[i]) == _shards(source, mine)
    assert mix([CachedDataset(small_cache)]).mosaic_pool(np.arange(8)) is None  # local: anywhere
    with pytest.raises(UsageError, match="boxes or masks"):  # a mix is of classification caches
        make_loader(both, 4, seed=1, augment=[Mosaic(16)], window=7)
