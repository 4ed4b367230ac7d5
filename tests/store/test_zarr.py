"""zarr shards read safely: only regular files, an index checked as unsigned and by its crc32c."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from manifests import listed_manifest

from cachekit import BuildConfig, CachedDataset, CacheError, build
from cachekit.store.atomic import path_size, sha256_path
from cachekit.store.formats import get_format, identity_column
from cachekit.store.formats.zarr import _crc32c
from cachekit.store.manifest import SampleSpec
from cachekit.tools.verify import verify

_INNER = ("images", "c", "0", "0", "0", "0")


@pytest.fixture(scope="module")
def zarr_cache(small_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("zarr") / "cache"
    build(small_tree, out, BuildConfig(format="zarr", size=32, shard_size=7, workers=1, progress=False))
    return out


@pytest.fixture
def cache(zarr_cache, tmp_path):
    shutil.copytree(zarr_cache, tmp_path / "c")
    return tmp_path / "c"


def _manifest(cache):
    return listed_manifest(cache)


def _agree(cache, manifest, i=0):
    """Make the manifest agree with a rewritten shard, as an attacker would."""
    info = manifest["shards"][i]
    info["bytes"] = path_size(cache / info["file"])
    info["sha256"] = sha256_path(cache / info["file"])
    (cache / "manifest.json").write_text(json.dumps(manifest))


def _without_hanging(fn, fifo):
    """Run ``fn`` in a thread; if it blocks on ``fifo`` past a generous limit, unblock it and fail."""
    outcome = {}

    def run():
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # handed to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY)  # lets the blocked open() return, then EOF
        os.close(fd)
        thread.join(10)
        pytest.fail("reading blocked on a FIFO inside the shard folder")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.mark.parametrize("where", [("shard_name", "c", "0"), _INNER, ("labels", "zarr.json")])
def test_a_fifo_inside_a_shard_folder_never_blocks(cache, where):
    manifest = _manifest(cache)
    name = manifest["shards"][0]["file"]
    fifo = cache.joinpath(name, *where)
    fifo.unlink()
    os.mkfifo(fifo)
    ds = _without_hanging(lambda: CachedDataset(cache), fifo)  # shards are checked when first read
    with pytest.raises(CacheError, match="not a regular file"):
        _without_hanging(lambda: ds.read_batch(np.arange(len(ds))), fifo)
    problems = _without_hanging(lambda: {p.file: p.problem for p in verify(cache).problems}, fifo)
    assert list(problems) == [name] and "not a regular file" in problems[name]
    spec = SampleSpec.from_json(manifest["sample"])
    with pytest.raises(CacheError, match="not a regular file"):  # the reader checks on its own too
        _without_hanging(lambda: get_format("zarr").open(cache / name, spec, 7), fifo)


def _rewrite_index(path, samples, change, fix_crc=True):
    data = bytearray(path.read_bytes())
    start, end = len(data) - 16 * samples - 4, len(data) - 4
    index = np.frombuffer(bytes(data[start:end]), dtype="<u8").reshape(samples, 2).copy()
    change(index)
    data[start:end] = index.astype("<u8").tobytes()
    if fix_crc:
        data[end:] = _crc32c(bytes(data[start:end])).to_bytes(4, "little")
    path.write_bytes(bytes(data))


def test_an_index_offset_with_its_top_bit_set_does_not_wrap(cache):
    manifest = _manifest(cache)
    info = manifest["shards"][0]
    inner = cache.joinpath(info["file"], *_INNER)

    def top_bit(index):  # as int64 this wraps to a negative offset, and "offset + size <= end" holds
        index[1, 0] = index[1, 0] + np.uint64(2**63)

    _rewrite_index(inner, info["samples"], top_bit)
    _agree(cache, manifest)
    with pytest.raises(CacheError, match=f"{info['file']}: images shard index points outside the file"):
        CachedDataset(cache)[1]
    assert "points outside" in verify(cache).problems[0].problem


def test_an_index_that_fails_its_checksum_is_refused(cache):
    manifest = _manifest(cache)
    info = manifest["shards"][0]
    inner = cache.joinpath(info["file"], *_INNER)

    def swap(index):  # sample 0 now reads sample 1's bytes: in bounds, only the checksum can tell
        index[[0, 1]] = index[[1, 0]]

    _rewrite_index(inner, info["samples"], swap, fix_crc=False)
    _agree(cache, manifest)
    with pytest.raises(CacheError, match="crc32c"):
        CachedDataset(cache)[0]
    # with a matching checksum, the same index is a valid (if reordered) shard
    _rewrite_index(inner, info["samples"], lambda index: None, fix_crc=True)
    _agree(cache, manifest)
    assert CachedDataset(cache)[0][0].shape == (3, 32, 32)


def test_our_checksum_is_the_one_zarr_writes(zarr_cache):
    import google_crc32c

    info = _manifest(zarr_cache)["shards"][0]
    data = zarr_cache.joinpath(info["file"], *_INNER).read_bytes()
    index = data[-(16 * info["samples"] + 4) : -4]
    assert _crc32c(index) == google_crc32c.value(index) == int.from_bytes(data[-4:], "little")
    assert _crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_an_all_black_sample_is_stored_and_read(tmp_path, codec):
    import zarr

    fmt = get_format("zarr")
    images = np.random.default_rng(0).integers(0, 256, (4, 3, 8, 8), dtype=np.uint8)
    images[2] = 0  # equal to the fill value: zarr would leave its chunk out
    spec = SampleSpec(shape=(3, 8, 8))
    name = "s.zarr"
    arrays = {"images": images, "labels": np.arange(4), "shard_name": identity_column(name)}
    fmt.write(tmp_path / name, arrays, {"compression": codec})
    reader = fmt.open(tmp_path / name, spec, 4)
    assert np.array_equal(reader.images(np.arange(4)), images)
    if codec == "none":
        assert reader.image_array is not None  # every chunk written: still one even memory map
    # a shard from a zarr writer that left the chunk out reads the fill value there
    other = tmp_path / "other" / name
    group = zarr.group(store=zarr.storage.LocalStore(other), zarr_format=3)
    group.create_array(
        "images",
        shape=images.shape,
        dtype="|u1",
        chunks=(1, 3, 8, 8),
        shards=images.shape,
        compressors=None,
        fill_value=0,
        config={"write_empty_chunks": False},
    )[...] = images
    for key in ("labels", "shard_name"):
        group.create_array(key, data=arrays[key], fill_value=0)
    reader = fmt.open(other, spec, 4)
    assert np.array_equal(reader.images(np.arange(4)), images)
    assert torch.equal(
        torch.from_numpy(reader.images(np.array([2]))), torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    )


def test_zarr_v2_metadata_with_a_pickle_codec_never_runs(cache, tmp_path):
    import pickle

    manifest = _manifest(cache)
    name = manifest["shards"][0]["file"]
    shard = cache / name
    shutil.rmtree(shard)
    shard.mkdir()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (shard / ".zgroup").write_text(json.dumps({"zarr_format": 2}))
    for column, dtype in (("labels", "|O"), ("shard_name", "|O")):
        (shard / column).mkdir()
        meta = {
            "zarr_format": 2,
            "shape": [7],
            "chunks": [7],
            "dtype": dtype,
            "compressor": None,
            "filters": [{"id": "pickle"}],
            "fill_value": None,
            "order": "C",
        }
        (shard / column / ".zarray").write_text(json.dumps(meta))
        (shard / column / "0").write_bytes(pickle.dumps([Payload()] * 7))
    _agree(cache, manifest)
    with pytest.raises(CacheError, match=name):
        CachedDataset(cache)[0]
    assert name in {p.file for p in verify(cache).problems}
    assert not marker.exists()


@pytest.mark.parametrize("name", ["blosc", "zstd", "gzip"])
def test_a_chunk_is_never_decompressed_past_the_sample_size(name):
    import numcodecs

    from cachekit.store.formats.zarr import _decoder

    codec = {"blosc": numcodecs.Blosc(cname="zstd"), "zstd": numcodecs.Zstd(), "gzip": numcodecs.GZip()}[name]
    decode = _decoder([{"name": "bytes"}, {"name": name}])
    sample = np.arange(192, dtype=np.uint8)
    out = np.empty(192, dtype=np.uint8)
    decode(np.frombuffer(codec.encode(sample), dtype=np.uint8), out)
    assert np.array_equal(out, sample)
    bomb = np.frombuffer(codec.encode(np.zeros(50_000_000, dtype=np.uint8)), dtype=np.uint8)
    with pytest.raises(ValueError):  # 50 MB declared for a 192-byte sample: refused, not allocated
        decode(bomb, out)
    cut = np.frombuffer(codec.encode(sample), dtype=np.uint8)[:-8].copy()
    with pytest.raises(Exception):  # noqa: B017 - each codec has its own error for a cut chunk
        decode(cut, out)


def test_an_index_entry_running_past_the_data_is_refused_by_reads_and_verify(cache):
    """An offset inside the file with a size that runs past the data (into the index itself)."""
    manifest = _manifest(cache)
    info = manifest["shards"][0]
    inner = cache.joinpath(info["file"], *_INNER)
    data_end = inner.stat().st_size - 16 * info["samples"] - 4

    def past_the_end(index):
        index[2, 1] = np.uint64(data_end) - index[2, 0] + np.uint64(8)

    _rewrite_index(inner, info["samples"], past_the_end)
    _agree(cache, manifest)
    with pytest.raises(CacheError, match=r"points outside the file \(sample 2: "):
        CachedDataset(cache)[2]
    (problem,) = verify(cache).problems
    assert problem.file == info["file"] and "points outside the file" in problem.problem


@pytest.mark.slow
@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_compressed_shard_of_more_than_2_gib_of_pixels_is_written_and_read(tmp_path, codec):
    # a codec such as Blosc takes at most 2 GiB in one call: a compressed column is never one chunk
    side = 26_755  # 3 x side x side bytes: just past 2 GiB
    pixels = np.zeros(3 * side * side, dtype=np.uint8)
    pixels[::4099] = 7
    pixels[-3:] = (1, 2, 3)
    name = "s.zarr"
    arrays = {
        "image_bytes": pixels,
        "image_offsets": np.array([0, pixels.size], dtype=np.int64),
        "image_shape": np.array([[side, side, 3]], dtype=np.int32),
        "labels": np.zeros(1, dtype=np.int64),
        "shard_name": identity_column(name),
    }
    fmt = get_format("zarr")
    fmt.write(tmp_path / name, arrays, {"compression": codec})
    reader = fmt.open(tmp_path / name, SampleSpec(shape=(3, None, None)), 1, "pixels-hwc")
    try:
        assert np.array_equal(reader.column("image_bytes", slice(-5000, None)), pixels[-5000:])
    finally:
        reader.close()


def test_a_missing_chunk_of_image_bytes_is_refused_not_read_as_black(small_tree, tmp_path):
    # zarr reads a missing chunk as its fill value: a variable-size shard would read all black
    out = tmp_path / "c"
    options = dict(
        format="zarr", pipeline="none", store="pixels-hwc", shard_size=7, workers=1, progress=False
    )
    build(small_tree, out, BuildConfig(**options))
    manifest = _manifest(out)
    info = manifest["shards"][0]
    (out / info["file"] / "image_bytes" / "c" / "0").unlink()
    _agree(out, manifest)
    with pytest.raises(CacheError, match=r"its image bytes \(\d+ of them\) are missing"):
        CachedDataset(out)[0]
    (problem,) = verify(out).problems
    assert problem.file == info["file"] and "are missing" in problem.problem
