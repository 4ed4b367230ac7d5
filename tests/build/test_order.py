"""Mixed shards: a seeded order that mixes classes in every shard and survives --update, workers, resume."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, UsageError, build, read_manifest
from cachekit.tools.synthetic import make_synthetic_folder


@pytest.fixture(scope="module")
def classes_tree(tmp_path_factory):
    """96 tiny JPEGs in 8 classes."""
    return make_synthetic_folder(
        tmp_path_factory.mktemp("classes") / "raw", 96, classes=8, size=(20, 24), seed=2
    )


def _shard_labels(out) -> list[list[int]]:
    ds, m = CachedDataset(out), read_manifest(out)
    labels = ds.read_batch(np.arange(len(ds)))[1].tolist()
    bounds = np.cumsum([0, *(s.samples for s in m.shards)])
    return [labels[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _copy(tree, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(tree, raw)
    return raw


def test_every_shard_mixes_the_classes(classes_tree, tmp_path):
    build(classes_tree, tmp_path / "mixed", BuildConfig(size=8, shard_size=12, workers=2, progress=False))
    build(
        classes_tree,
        tmp_path / "sorted",
        BuildConfig(size=8, shard_size=12, order="sorted", workers=2, progress=False),
    )
    m = read_manifest(tmp_path / "mixed")
    assert m.order == {"kind": "shuffled", "seed": 0, "shards": 8} and m.shards_mixed
    assert read_manifest(tmp_path / "sorted").order == {"kind": "sorted"}
    assert all(len(set(shard)) == 1 for shard in _shard_labels(tmp_path / "sorted"))  # one class a shard
    rng = np.random.default_rng(0)
    for shard in _shard_labels(tmp_path / "mixed"):
        # as many classes as a uniform draw of the same size would give (mean over 200 draws), within 25%
        uniform = np.mean([len(set(rng.integers(0, 8, len(shard)))) for _ in range(200)])
        assert len(set(shard)) >= 0.75 * uniform and max(Counter(shard).values()) <= len(shard) / 2


def test_the_order_is_the_same_whatever_the_workers_and_differs_by_seed(classes_tree, tmp_path):
    for name, workers, seed in (("a", 1, 0), ("b", 2, 0), ("c", 2, 5)):
        build(
            classes_tree,
            tmp_path / name,
            BuildConfig(size=8, shard_size=12, seed=seed, workers=workers, progress=False),
        )
    ma, mb, mc = (read_manifest(tmp_path / n) for n in "abc")
    assert ma.to_json() | {"created": ""} == mb.to_json() | {"created": ""}
    sources = [[CachedDataset(tmp_path / n).source(i) for i in range(96)] for n in "ac"]
    assert sorted(sources[0]) == sorted(sources[1]) and sources[0] != sources[1]
    with pytest.raises(UsageError, match=r"seed 0 -> 5.*--overwrite"):
        build(classes_tree, tmp_path / "a", BuildConfig(size=8, shard_size=12, seed=5, progress=False))


@pytest.mark.parametrize("augment", [0, 2], ids=["plain", "augmented"])
def test_update_with_one_new_file_rebuilds_one_shard(classes_tree, tmp_path, augment):
    raw = _copy(classes_tree, tmp_path)
    out = tmp_path / "c"
    config = dict(size=8, shard_size=12, augment=augment, workers=2, progress=False)
    first = build(raw, out, BuildConfig(**config))
    shutil.copy(raw / "class_003" / "img_0000003.jpg", raw / "class_003" / "new.jpg")
    second = build(raw, out, BuildConfig(update=True, **config))
    assert second.status == "updated" and second.built_shards == 1
    assert second.reused_shards == len(first.manifest.shards) - 1 == 7
    (raw / "class_005" / "img_0000005.jpg").unlink()
    third = build(raw, out, BuildConfig(update=True, **config))
    assert third.built_shards == 1 and third.manifest.order["shards"] == 8  # the shard count is kept
    fresh = build(raw, tmp_path / "fresh", BuildConfig(shards=8, **config))
    assert fresh.manifest.to_json() | {"created": ""} == third.manifest.to_json() | {"created": ""}
    for s in third.manifest.shards:
        assert (out / s.file).read_bytes() == (tmp_path / "fresh" / s.file).read_bytes()


def test_sorted_update_keeps_the_shards_before_the_change(classes_tree, tmp_path):
    raw = _copy(classes_tree, tmp_path)
    out = tmp_path / "c"
    config = dict(size=8, shard_size=12, order="sorted", workers=2, progress=False)
    build(raw, out, BuildConfig(**config))
    shutil.copy(raw / "class_007" / "img_0000007.jpg", raw / "class_007" / "zzz.jpg")  # sorts last
    result = build(raw, out, BuildConfig(update=True, **config))
    assert result.built_shards == 1 and result.reused_shards == 8 and len(result.manifest.shards) == 9
