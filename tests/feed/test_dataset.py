"""CachedDataset: indexing, batched reads, pickling, and real multi-process DataLoaders."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from manifests import listed_manifest
from torch.utils.data import DataLoader

from cachekit import CachedDataset, CacheError, SampleBatch, collate_batch


def test_len_index_and_errors(small_cache):
    ds = CachedDataset(small_cache)
    assert len(ds) == 40 and ds.num_shards == 6
    image, label = ds[0]
    assert image.dtype == torch.uint8 and tuple(image.shape) == (3, 32, 32) and isinstance(label, int)
    assert torch.equal(ds[-1][0], ds[39][0])
    with pytest.raises(IndexError):
        ds[40]
    with pytest.raises(IndexError):
        ds.__getitems__([0, 41])
    with pytest.raises(TypeError):
        ds[1.5]


def test_getitems_returns_the_same_samples_in_the_requested_order(small_cache):
    ds = CachedDataset(small_cache)
    order = [39, 3, 3, 17, 0, 22, 8]
    batch = ds.__getitems__(order)
    assert isinstance(batch, SampleBatch) and len(batch) == len(order)
    for j, i in enumerate(order):
        image, label = ds[i]
        assert torch.equal(batch.images[j], image) and int(batch.labels[j]) == label
        assert torch.equal(batch[j][0], image)
    one_shard = ds.__getitems__([1, 0, 2])  # a whole batch inside the first shard
    assert torch.equal(one_shard.images[0], ds[1][0])


def test_transform_and_target_transform(small_cache):
    ds = CachedDataset(small_cache, transform=lambda x: x.float() / 255, target_transform=lambda y: y + 100)
    image, label = ds[5]
    assert image.dtype == torch.float32 and label >= 100
    batch = ds.__getitems__([5, 6])
    assert isinstance(batch, list) and batch[0][1] == label


def test_pickles_without_open_readers(small_cache):
    ds = CachedDataset(small_cache)
    ds[0]
    clone = pickle.loads(pickle.dumps(ds))
    assert len(clone._readers) == 0 and torch.equal(clone[7][0], ds[7][0])


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("collate", [None, collate_batch], ids=["default_collate", "collate_batch"])
def test_dataloader_yields_every_sample_once(small_cache, workers, collate):
    ds = CachedDataset(small_cache)
    kwargs = {"collate_fn": collate} if collate else {}
    loader = DataLoader(ds, batch_size=6, shuffle=True, num_workers=workers, **kwargs)
    reference = ds.read_batch(np.arange(len(ds)))[0]
    seen = []
    for images, _labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
        for img in images:
            match = [i for i in range(len(ds)) if torch.equal(reference[i], img)]
            assert len(match) == 1
            seen.append(match[0])
    assert sorted(seen) == list(range(len(ds)))


def test_missing_or_broken_manifest_is_a_cache_error(small_cache, tmp_path):
    with pytest.raises(CacheError, match="no such cache"):
        CachedDataset(tmp_path / "nowhere")
    with pytest.raises(CacheError, match="no manifest.json"):
        CachedDataset(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(CacheError, match="not valid JSON"):
        CachedDataset(tmp_path)
    good = listed_manifest(small_cache)
    for mutate, message in [
        (lambda m: m.update(format_version=99), "format mismatch"),
        (lambda m: m["shards"][0].update(file="../evil.pt"), "plain file name"),
        (lambda m: m["shards"][0].update(samples="7"), "samples"),
        (lambda m: m.update(num_samples=41), "does not match"),
        (lambda m: m.update(format="parquet"), "unknown format"),
        (lambda m: m.pop("sample"), "missing field 'sample'"),
    ]:
        bad = json.loads(json.dumps(good))
        mutate(bad)
        (tmp_path / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(CacheError, match=message):
            CachedDataset(tmp_path)


def test_missing_shard_file_is_a_cache_error(small_cache, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(small_cache, copy)
    victim = listed_manifest(copy)["shards"][2]["file"]
    (copy / victim).unlink()
    ds = CachedDataset(copy)  # shards are checked when first read, not all at open
    ds.read_batch([0])
    with pytest.raises(CacheError, match=f"{victim} missing"):
        ds.read_batch(np.arange(len(ds)))


def test_batch_buffers_are_reused_only_when_nothing_holds_them(small_cache):
    ds = CachedDataset(small_cache)
    first = ds.read_batch([0, 1, 2])[0]
    view = first[1:]  # a view keeps the buffer alive after the batch itself is gone
    expected = ds.read_batch([1, 2])[0].clone()
    del first
    second = ds.read_batch([3, 4, 5])[0]
    assert not np.shares_memory(view.numpy(), second.numpy())
    assert torch.equal(view, expected)
    pointer = second.data_ptr()
    del second
    third = ds.read_batch([6, 7, 8])[0]
    assert third.data_ptr() == pointer  # released, so recycled: no fresh pages to fault in
    assert torch.equal(third, torch.stack([ds[i][0] for i in (6, 7, 8)]))
