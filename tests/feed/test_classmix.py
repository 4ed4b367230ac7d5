"""Batches from real builds mix classes like a uniform shuffle, whichever order the build used."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.tools.synthetic import make_synthetic_folder

CLASSES, PER_CLASS, BATCH = 20, 20, 32


@pytest.fixture(scope="module")
def twenty_classes(tmp_path_factory):
    return make_synthetic_folder(
        tmp_path_factory.mktemp("mix") / "raw", CLASSES * PER_CLASS, classes=CLASSES, size=(20, 24), seed=3
    )


def _distinct(batches: list[np.ndarray]) -> float:
    return float(np.mean([len(np.unique(b)) for b in batches if len(b) == BATCH]))


def _uniform(labels: np.ndarray) -> float:
    draws = [np.random.default_rng(s).permutation(labels) for s in range(5)]
    return float(np.mean([_distinct(np.split(d[: len(d) // BATCH * BATCH], len(d) // BATCH)) for d in draws]))


@pytest.mark.slow
@pytest.mark.parametrize("order", ["shuffled", "sorted"])
def test_batches_hold_as_many_classes_as_a_uniform_shuffle(twenty_classes, tmp_path, order):
    cache = tmp_path / order
    build(twenty_classes, cache, BuildConfig(size=16, shard_size=40, order=order, workers=1, progress=False))
    ds = CachedDataset(cache)
    labels = np.array([label for _, label in ds.__getitems__(list(range(len(ds))))])
    shards = [np.unique(labels[a:b]).size for a, b in zip(ds.shard_offsets[:-1], ds.shard_offsets[1:])]
    if order == "sorted":
        assert max(shards) <= 2  # class-pure shards: the hard case for a shard-local shuffle
    else:
        assert min(shards) >= 10  # inputs spread over shards by a hash: every shard a mix
    uniform = _uniform(labels)
    loader = make_loader(ds, BATCH)
    fed = _distinct([y.numpy() for _, y in loader])
    assert fed >= 0.9 * uniform, (fed, uniform)
    if order == "shuffled":  # mixed shards stay mixed even when only two shards are shuffled together
        local = make_loader(ds, BATCH, window=80)
        assert _distinct([y.numpy() for _, y in local]) >= 0.9 * uniform
    else:  # and a narrow window over class-pure shards would not be (the old default)
        narrow = make_loader(ds, BATCH, window=80)
        assert _distinct([y.numpy() for _, y in narrow]) < 0.6 * uniform
