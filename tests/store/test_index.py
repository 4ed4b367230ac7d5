"""Format 5's binary shard index: what a build writes, what a reader maps (and refuses), caches of
formats 3 and 4 read as before, and opening that touches no shard and pickles no shard list."""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from manifests import listed_manifest

from cachekit import CachedDataset, CacheError, ShardAwareDistributedSampler, read_manifest, verify
from cachekit.store.index import ShardIndex, write_index
from cachekit.store.manifest import ShardInfo
from cachekit.store.shardtable import ShardTable
from cachekit.tools.synthindex import write_synthetic_index


def test_a_build_writes_the_index_before_a_manifest_that_names_it(small_cache):
    raw = json.loads((small_cache / "manifest.json").read_text())
    assert raw["format_version"] == 5 and "shards" not in raw
    record = raw["index"]
    path = small_cache / record["file"]
    assert path.stat().st_size == record["bytes"] and record["file"].startswith("index-")
    assert path.stat().st_mtime_ns <= (small_cache / "manifest.json").stat().st_mtime_ns
    m = read_manifest(small_cache)
    assert isinstance(m.shards, ShardTable) and len(m.shards) == raw["num_shards"] == record["shards"]
    listed = listed_manifest(small_cache)["shards"]  # every field of every shard, as format 4 lists them
    assert [s.to_json() for s in m.shards] == listed
    assert m.num_samples == raw["num_samples"] and m.total_bytes == raw["total_bytes"]
    assert m.shard_offsets.tolist() == np.cumsum([0] + [s["samples"] for s in listed]).tolist()
    assert verify(small_cache).ok


@pytest.mark.parametrize("version", [3, 4])
def test_caches_of_formats_3_and_4_read_identically(small_cache, tmp_path, version):
    old = tmp_path / "old"
    shutil.copytree(small_cache, old)
    obj = listed_manifest(old) | {"format_version": version}  # the form those versions wrote
    (old / json.loads((small_cache / "manifest.json").read_text())["index"]["file"]).unlink()
    (old / "manifest.json").write_text(json.dumps(obj))
    a, b = CachedDataset(small_cache), CachedDataset(old)
    assert b.manifest.format_version == version and isinstance(b.manifest.shards, tuple)
    order = np.random.default_rng(0).permutation(len(a))
    ia, la = a.read_batch(order)
    ib, lb = b.read_batch(order)
    assert torch.equal(ia, ib) and torch.equal(la, lb)
    assert np.array_equal(a.shard_offsets, b.shard_offsets)
    sa, sb = ShardAwareDistributedSampler(a, 3, 1, seed=4), ShardAwareDistributedSampler(b, 3, 1, seed=4)
    assert list(sa) == list(sb)
    assert verify(old).ok


def test_a_dataset_pickles_its_index_by_path(small_cache):
    ds = CachedDataset(small_cache)
    blob = pickle.dumps(ds)
    assert len(blob) < 8_000 and b"shard-" not in blob  # no shard list travels to a worker
    again = pickle.loads(blob)
    assert again.manifest.shards.index._cols is None  # mapped when first used, in the worker
    assert torch.equal(again.read_batch([0, 5, 30])[0], ds.read_batch([0, 5, 30])[0])


class _Calls:
    """Counts file-system calls (stat, open, listing) and the paths they name."""

    def __init__(self, monkeypatch) -> None:
        self.paths: list[str] = []
        for module, name in [(os, "stat"), (os, "lstat"), (os, "open"), (os, "scandir"), (os, "listdir")]:
            self._wrap(monkeypatch, module, name)
        self._wrap(monkeypatch, builtins, "open")

    def _wrap(self, monkeypatch, module, name) -> None:
        real = getattr(module, name)

        def counted(*args, **kwargs):
            self.paths.append(str(args[0]) if args else "")
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)


def test_opening_a_large_index_touches_no_shard(tmp_path, monkeypatch):
    root = write_synthetic_index(tmp_path / "big", 300_000, 20_000)  # the shards themselves are absent
    calls = _Calls(monkeypatch)
    ds = CachedDataset(root)
    sampler = ShardAwareDistributedSampler(ds, 64, 5, seed=1)
    mine = sampler.indices()
    worker = pickle.loads(pickle.dumps(ds))
    assert len(worker.shard_offsets) == 20_001 and len(mine) == 300_000 // 64 + 1
    monkeypatch.undo()
    assert len(calls.paths) < 20  # a handful for the manifest and the index, none per shard
    assert not [p for p in calls.paths if "shard-" in p]
    with pytest.raises(CacheError, match="shard-.* missing"):  # a shard is checked when first read
        ds.read_batch([int(mine[0])])


def _index_copy(small_cache, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(small_cache, cache)
    return cache, cache / json.loads((cache / "manifest.json").read_text())["index"]["file"]


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda b: b[:-8], "bytes, the manifest says"),
        (lambda b: b"XXINDEX\0" + b[8:], "bad magic"),
        (lambda b: b[:12] + (2**30).to_bytes(4, "little") + b[16:], "bad magic, version or header"),
    ],
)
def test_a_damaged_index_is_refused_in_one_line(small_cache, tmp_path, damage, words):
    cache, index = _index_copy(small_cache, tmp_path)
    index.write_bytes(damage(index.read_bytes()))
    with pytest.raises(CacheError, match=words) as err:
        CachedDataset(cache)
    assert "\n" not in str(err.value)


def test_offsets_that_do_not_add_up_are_refused(small_cache, tmp_path):
    cache, index = _index_copy(small_cache, tmp_path)
    shards = list(read_manifest(small_cache).shards)
    shards[1], shards[2] = shards[2], shards[1]
    write_index(index, [shards[0].__class__(**{**shards[0].__dict__, "samples": 3})] + shards[1:], 3)
    obj = json.loads((cache / "manifest.json").read_text())
    obj["index"]["bytes"] = index.stat().st_size
    (cache / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(CacheError, match="counts are not the manifest's"):
        CachedDataset(cache)


def test_verify_hashes_the_index(small_cache, tmp_path):
    cache, index = _index_copy(small_cache, tmp_path)
    data = bytearray(index.read_bytes())
    offsets = ShardIndex(index, read_manifest(cache).index).columns
    sha_at = len(data) - sum(v.nbytes for v in offsets.values())  # somewhere in the columns
    data[sha_at + 700] ^= 0xFF  # a column's byte: sizes and layout unchanged
    index.write_bytes(bytes(data))
    report = verify(cache)
    assert not report.ok and any(p.file == index.name and "sha256" in p.problem for p in report.problems)


def test_a_remote_cache_opens_from_its_index_without_a_listing(mixed_s3_cache, tmp_path, monkeypatch):
    import s3fs

    url, local = mixed_s3_cache
    listed = []
    real_ls = s3fs.S3FileSystem._ls

    async def no_ls(self, path, *args, **kwargs):
        listed.append(path)
        return await real_ls(self, path, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_ls", no_ls)
    ds = CachedDataset(url, local_cache=tmp_path / "node")
    assert not listed  # the index object, fetched once, is the shard list
    copy = ds.manifest.shards.index.path
    assert copy.parent == ds.root and copy.stat().st_size == ds.manifest.index["bytes"]
    again = CachedDataset(url, local_cache=tmp_path / "node")
    assert again.manifest.shards.index.path == copy  # the node's copy, mapped again
    good = copy.read_bytes()
    copy.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # changed on the node: same size, new stamp
    third = CachedDataset(url, local_cache=tmp_path / "node")
    assert copy.read_bytes() == good and third.manifest.shards.index.path == copy  # hashed, fetched again
    want = CachedDataset(local).read_batch([0, 17, 95])
    got = ds.read_batch([0, 17, 95])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _info(k: int, first: str = "a/b.jpg") -> ShardInfo:
    return ShardInfo(
        file=f"shard-{k:020x}.pt",
        samples=k + 1,
        bytes=1000 + k,
        sha256=f"{k:064x}",
        inputs=k + 2,
        first=first,
        last=f"z/{k}.jpg",
        inputs_digest=f"{k + 7:064x}",
        pixel_sum=(1.5 * k, 2.0, 3.0),
        pixel_sumsq=(4.0, 5.0, 6.25 * k),
        pixel_count=17 * k,
    )


def test_the_index_round_trips_every_field_and_name_bytes(tmp_path):
    shards = [_info(k, first="caf\udce9/\u00e9t\u00e9.jpg" if k == 1 else "a/b.jpg") for k in range(5)]
    path = tmp_path / "index.bin"
    write_index(path, shards, 3)
    record = {"file": "index.bin", "bytes": path.stat().st_size, "shards": 5, "samples": 15}
    table = ShardTable(ShardIndex(path, record))
    assert list(table) == shards and table[-1] == shards[-1] and table[1:3] == shards[1:3]
    assert table == shards and table.offsets.tolist() == [0, 1, 3, 6, 10, 15]
    assert table[1].first.encode("utf-8", "surrogateescape") == "caf\udce9/\u00e9t\u00e9.jpg".encode(
        "utf-8", "surrogateescape"
    )  # a name that is not UTF-8 keeps its bytes
    with pytest.raises(IndexError):
        table[5]
    again = pickle.loads(pickle.dumps(table))
    assert again.index._cols is None and list(again) == shards


def test_a_column_past_the_end_or_a_bad_name_is_refused(tmp_path):
    path = tmp_path / "index.bin"
    write_index(path, [_info(0), _info(1)], 3)
    data = path.read_bytes()
    header = json.loads(data[16 : 16 + int.from_bytes(data[12:16], "little")])
    header["columns"][-1]["offset"] = len(data) + 64  # the last column said to lie past the file
    text = json.dumps(header).encode().ljust(int.from_bytes(data[12:16], "little"))
    path.write_bytes(data[:16] + text + data[16 + len(text) :])
    record = {"file": "index.bin", "bytes": len(data), "shards": 2, "samples": 3}
    with pytest.raises(CacheError, match="lies outside the file"):
        ShardIndex(path, record)
    write_index(path, [_info(0), dataclasses.replace(_info(1), file="../../etc/passwd")], 3)
    table = ShardTable(ShardIndex(path, record | {"bytes": path.stat().st_size}))
    assert table[0].file == _info(0).file
    with pytest.raises(CacheError, match="not a plain file name"):
        table[1]


def test_a_synthetic_index_needs_a_shard_per_sample_at_most(tmp_path):
    with pytest.raises(ValueError, match="shards <= samples"):
        write_synthetic_index(tmp_path / "x", 10, 11)
    root = write_synthetic_index(tmp_path / "y", 1000, 7)
    m = read_manifest(root)
    assert (
        m.num_samples == 1000
        and len(m.shards) == 7
        and np.diff(m.shard_offsets).tolist() == [143] * 6 + [142]
    )


def _rehead(index, edit) -> None:
    """Rewrite the index's JSON header through ``edit`` (a header dict to bytes), its length updated."""
    data = bytearray(index.read_bytes())
    length = int.from_bytes(data[12:16], "little")
    header = edit(json.loads(bytes(data[16 : 16 + length])))
    assert len(header) <= 4096
    data[12:16] = len(header).to_bytes(4, "little")
    data[16 : 16 + len(header)] = header
    index.write_bytes(bytes(data))


def _column_at_infinity(h):
    h["columns"][0]["offset"] = float("inf")
    return json.dumps(h).encode()


@pytest.mark.parametrize(
    "edit",
    [_column_at_infinity, lambda h: b"[" * 2000 + b"]" * 2000],
    ids=["offset-infinity", "nested-2000-deep"],
)
def test_a_hostile_index_header_is_refused_in_one_line(small_cache, tmp_path, edit):
    cache, index = _index_copy(small_cache, tmp_path)
    _rehead(index, edit)
    with pytest.raises(CacheError, match="not a valid shard index") as err:
        CachedDataset(cache)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_an_index_that_is_not_a_regular_file_is_refused_without_blocking(small_cache, tmp_path, kind):
    cache, index = _index_copy(small_cache, tmp_path)
    index.unlink()
    if kind == "fifo":
        os.mkfifo(index)  # opened for reading, it would wait for a writer forever
    else:
        index.mkdir()
        obj = json.loads((cache / "manifest.json").read_text())
        obj["index"]["bytes"] = index.stat().st_size  # the size agrees: only the type is wrong
        (cache / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(CacheError, match="not a regular file") as err:
        CachedDataset(cache)
    assert "\n" not in str(err.value)
    with pytest.raises(CacheError, match="not a regular file"):
        verify(cache)


def test_a_remote_index_of_another_size_is_refused_before_it_is_fetched(small_cache, tmp_path):
    import fsspec

    from cachekit.store.remoteindex import fetch_index

    cache, index = _index_copy(small_cache, tmp_path)
    record = read_manifest(small_cache).index
    with open(index, "ab") as fh:
        fh.truncate(index.stat().st_size + (64 << 20))  # an object far past what the manifest says
    fs = fsspec.filesystem("file")
    fetched = []
    real_get = fs.get_file
    fs.get_file = lambda *a, **k: fetched.append(a) or real_get(*a, **k)
    with pytest.raises(CacheError, match=f"is {index.stat().st_size} bytes, the manifest says") as err:
        fetch_index(fs, str(cache), "s3://bucket/c", record, folder=tmp_path / "node")
    assert fetched == [] and "\n" not in str(err.value)
    index.write_bytes(index.read_bytes()[: record["bytes"]])  # the right object is fetched and mapped
    (tmp_path / "node").mkdir()
    assert (
        len(fetch_index(fs, str(cache), "s3://bucket/c", record, folder=tmp_path / "node"))
        == record["shards"]
    )
    assert len(fetched) == 1


def _with_phantom(small_cache, tmp_path, listed: bool, **change) -> object:
    """A copy of ``small_cache`` with one more shard of ``change`` (no samples, no file) in its
    index (or its format 4 list), the manifest's counts, sizes and checksums made to agree."""
    from cachekit.store.atomic import sha256_path

    cache, index = _index_copy(small_cache, tmp_path)
    shards = list(read_manifest(small_cache).shards)
    phantom = dataclasses.replace(shards[0], **{"file": "shard-phantom.pt", "samples": 0, **change})
    if listed:
        obj = listed_manifest(cache)
        obj["shards"].append(phantom.to_json())
        index.unlink()
    else:
        write_index(index, [*shards, phantom], 3)
        obj = json.loads((cache / "manifest.json").read_text())
        obj["index"].update(bytes=index.stat().st_size, sha256=sha256_path(index), shards=len(shards) + 1)
        obj.update(num_shards=len(shards) + 1, total_bytes=sum(s.bytes for s in [*shards, phantom]))
    (cache / "manifest.json").write_text(json.dumps(obj))
    return cache


@pytest.mark.parametrize("listed", [False, True], ids=["index", "format 4 list"])
def test_a_shard_of_no_inputs_or_no_bytes_is_refused_where_the_index_is_checked(
    small_cache, tmp_path, listed
):
    """Every planned shard has an input at least and a file of some bytes: a shard entry of none,
    which holds no sample, is damage, refused when the cache is opened, not counted as a shard."""
    for change, words in (
        ({"inputs": 0}, "inputs: expected an integer from 1" if listed else "input or pixel count"),
        ({"bytes": 0}, "bytes: expected an integer from 1" if listed else "shard size is out of range"),
    ):
        cache = _with_phantom(small_cache, tmp_path / str(change), listed, **change)
        with pytest.raises(CacheError, match=words) as err:
            CachedDataset(cache)
        assert "\n" not in str(err.value)
    good = _with_phantom(small_cache, tmp_path / "good", listed, inputs=1)  # all its inputs skipped
    assert len(read_manifest(good).shards) == len(read_manifest(small_cache).shards) + 1


def test_a_shard_whose_inputs_were_all_skipped_keeps_its_entry_and_reads(tmp_path):
    """A shard of no samples is what a build writes when none of its inputs decodes: it opens,
    verifies and reads, so only a shard of no inputs is refused."""
    import cv2

    from cachekit import BuildConfig, build, make_loader

    raw = tmp_path / "raw" / "a"
    raw.mkdir(parents=True)
    for i in range(6):
        if i < 2:
            (raw / f"img{i}.png").write_bytes(b"not an image" * 8)
        else:
            cv2.imwrite(str(raw / f"img{i}.png"), np.full((8, 8, 3), 40 * i, np.uint8))
    config = BuildConfig(pipeline="none", order="sorted", shard_size=2, workers=1, progress=False)
    build(tmp_path / "raw", tmp_path / "c", config)
    m = read_manifest(tmp_path / "c")
    assert [(s.samples, s.inputs) for s in m.shards] == [(0, 2), (2, 2), (2, 2)]
    assert verify(tmp_path / "c").ok
    assert (
        sum(len(b[1]) for b in make_loader(tmp_path / "c", 2, pad=True))
        == len(CachedDataset(tmp_path / "c"))
        == 4
    )
