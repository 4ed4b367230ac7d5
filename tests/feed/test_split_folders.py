"""A folder of split caches (``OUT/train``, ``OUT/val``, as a build of a RAW naming splits writes
it) is opened one split at a time, and opening the folder itself names its splits in one line."""

from __future__ import annotations

import shutil

import pytest

from cachekit import CachedDataset, make_loader
from cachekit.errors import NotACacheError, UsageError
from cachekit.store.splitdirs import cache_splits, choose_split, split_path


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


def test_a_url_is_never_looked_up_on_disk(splits, monkeypatch):
    # "s3://bucket/out" read as a local path is s3:/bucket/out: a folder of splits made there is not the URL's
    local = splits.parent / "s3:" / "bucket"
    local.mkdir(parents=True)
    shutil.copytree(splits, local / "out")
    monkeypatch.chdir(splits.parent)
    assert cache_splits("s3:/bucket/out") == ("train", "val")
    assert cache_splits("s3://bucket/out") == ()
    assert split_path("s3://bucket/BOX/", "val") == "s3://bucket/BOX/val"
    assert split_path("s3://bucket/out-X", "train") == "s3://bucket/out-X/train"
    shutil.copy(local / "out" / "train" / "manifest.json", local / "out" / "manifest.json")
    assert choose_split("s3://bucket/out", "val") == ("s3://bucket/out/val", None)  # no local cache there


def test_a_cache_holding_caches_is_one_cache(splits, small_cache):
    inner = splits / "train"
    shutil.copytree(small_cache, inner / "old")  # a cache with a cache inside it is still one cache
    assert cache_splits(inner) == ()
    assert cache_splits(inner / "manifest.json") == ()  # a file is no folder of splits


def test_a_link_to_a_cache_is_no_split(splits, small_cache):
    (splits / "test").symlink_to(small_cache, target_is_directory=True)
    assert cache_splits(splits) == ("train", "val")
    with pytest.raises(NotACacheError, match=r"no split 'test' \(holds the splits train, val\)$"):
        split_path(splits, "test")


def test_a_folder_of_no_split_caches_says_so(tmp_path):
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(NotACacheError) as exc:
        split_path(tmp_path / "empty", "train")
    assert str(exc.value) == f"{tmp_path / 'empty'}: no split 'train' (holds no split caches)"
    assert cache_splits(tmp_path / "empty") == () and cache_splits(tmp_path / "nothing") == ()


def test_a_command_chooses_a_split(splits, small_cache):
    assert choose_split(splits) == (
        str(splits / "train"),
        f"{splits} holds splits train, val: using train (--split NAME for another)",
    )
    assert choose_split(splits, "val") == (str(splits / "val"), None)
    assert choose_split(small_cache) == (str(small_cache), None)
    assert choose_split("s3://bucket/out", "val") == ("s3://bucket/out/val", None)
    with pytest.raises(UsageError) as exc:
        choose_split(splits, default=None)
    assert str(exc.value) == f"{splits} holds splits train, val, each a cache: give --split NAME (one of them)"
    shutil.rmtree(splits / "train")
    with pytest.raises(UsageError, match=r"holds splits val, each a cache: give --split"):
        choose_split(splits)
    assert choose_split(splits, default="val")[0] == str(splits / "val")
    with pytest.raises(UsageError) as exc:
        choose_split(small_cache, "train")
    assert str(exc.value) == f"--split train: {small_cache} is one cache, not a folder of splits: leave out --split"
    with pytest.raises(NotACacheError, match="no split 'train'"):
        choose_split(splits, "train")
