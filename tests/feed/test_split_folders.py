"""A folder of split caches (``OUT/train``, ``OUT/val``, as a build of a RAW naming splits writes
it) is opened one split at a time, and opening the folder itself names its splits in one line."""

from __future__ import annotations

import shutil

import pytest

from cachekit import CachedDataset, make_loader
from cachekit.errors import NotACacheError, UsageError
from cachekit.store.splitdirs import cache_splits, split_path


@pytest.fixture
def splits(small_cache, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(small_cache, out / "train")
    shutil.copytree(small_cache, out / "val")
    (out / "notes").mkdir()  # a folder that is not a cache is no split
    return out


def test_the_folder_names_its_splits(splits):
    assert cache_splits(splits) == ("train", "val")
    with pytest.raises(NotACacheError) as exc:
        CachedDataset(splits)
    assert (
        str(exc.value)
        == f'{splits} holds splits train, val, each a cache: CachedDataset("{splits}", split="train")'
    )
    with pytest.raises(NotACacheError, match="holds splits train, val"):
        make_loader(str(splits), batch_size=4, workers=0)


def test_split_opens_that_cache(splits, small_cache):
    ds = CachedDataset(splits, split="val")
    whole = CachedDataset(small_cache)
    assert len(ds) == len(whole) and ds.root == splits / "val"
    image, label = ds[5]
    assert label == whole[5][1] and bool((image == whole[5][0]).all())
    loader = make_loader(splits, batch_size=8, workers=0, split="train", shuffle=False)
    assert sum(len(labels) for _, labels in loader) == len(whole)


def test_a_bad_split_is_one_line(splits, small_cache):
    with pytest.raises(NotACacheError, match=r"no split 'notes' \(holds the splits train, val\)"):
        CachedDataset(splits, split="notes")
    with pytest.raises(UsageError, match="plain folder name"):
        CachedDataset(splits, split="../out/train")
    with pytest.raises(UsageError, match="one cache, not a folder of splits"):
        CachedDataset(small_cache, split="train")
    with pytest.raises(ValueError, match="split= goes with a path"):
        make_loader(CachedDataset(small_cache), batch_size=4, workers=0, split="train")
    assert cache_splits(small_cache) == ()


def test_a_url_split_is_its_folder():
    assert split_path("s3://bucket/cache/", "val") == "s3://bucket/cache/val"
    with pytest.raises(UsageError, match="plain folder name"):
        split_path("s3://bucket/cache", "a/b")
