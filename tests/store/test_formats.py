"""One suite over every format x codec: the same pixels, labels and extras; convert round-trips."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from manifests import listed_manifest

from cachekit import BuildConfig, CachedDataset, UsageError, build, read_manifest
from cachekit.cli import main
from cachekit.tools.convert import convert
from cachekit.tools.verify import verify

CASES = [
    ("pt", "none"),
    ("hdf5", "none"),
    ("hdf5", "gzip"),
    ("hdf5", "lzf"),
    ("zarr", "none"),
    ("zarr", "zstd"),
    ("zarr", "lz4"),
    ("zarr", "gzip"),
]
if importlib.util.find_spec("hdf5plugin"):
    CASES += [("hdf5", "zstd"), ("hdf5", "lz4")]


def _everything(cache):
    ds = CachedDataset(cache)
    images, labels = ds.read_batch(np.arange(len(ds)))
    extras = [ds.extras(i)["orig_size"].tolist() for i in range(len(ds))]
    return images.clone(), labels.clone(), extras


@pytest.fixture(scope="module")
def reference(mixed_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "pt"
    build(mixed_tree, out, BuildConfig(size=48, shard_size=3, workers=1, progress=False))
    return out


@pytest.mark.parametrize("fmt, codec", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_every_format_and_codec_stores_the_same_samples(fmt, codec, mixed_tree, reference, tmp_path):
    out = tmp_path / "c"
    build(
        mixed_tree,
        out,
        BuildConfig(format=fmt, compression=codec, size=48, shard_size=3, workers=2, progress=False),
    )
    m = read_manifest(out)
    assert m.format == fmt and m.format_options["compression"] == codec
    got, want = _everything(out), _everything(reference)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
    ds = CachedDataset(out)
    order = [7, 0, 3, 3, 5]
    batch = ds.__getitems__(order)
    assert torch.equal(batch.images, want[0][order])
    assert verify(out).ok and verify(out, quick=True).ok
    assert m.skipped == read_manifest(reference).skipped


def test_zarr_shards_open_with_zarr_itself(reference, tmp_path):
    import zarr

    convert(reference, tmp_path / "z", "zarr", compression="zstd")
    m = read_manifest(tmp_path / "z")
    group = zarr.open_group(str(tmp_path / "z" / m.shards[0].file), mode="r")
    images = group["images"][...]
    assert images.shape == (m.shards[0].samples, 3, 48, 48)
    assert np.array_equal(
        images, CachedDataset(tmp_path / "z").read_batch(range(m.shards[0].samples))[0].numpy()
    )
    assert group["images"].metadata.codecs[0].__class__.__name__ == "ShardingCodec"


def test_convert_round_trips_are_pixel_identical(reference, tmp_path):
    want = _everything(reference)
    convert(reference, tmp_path / "z", "zarr", compression="lz4")
    convert(tmp_path / "z", tmp_path / "h", "hdf5", compression="gzip")
    result = CliRunner().invoke(
        main, ["convert", str(tmp_path / "h"), "--to", "pt", "--out", str(tmp_path / "p")]
    )
    assert result.exit_code == 0 and "converted:" in result.output
    for cache in ("z", "h", "p"):
        got = _everything(tmp_path / cache)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] == want[2]
        assert verify(tmp_path / cache).ok
    back = read_manifest(tmp_path / "p")
    assert back.format == "pt" and back.classes == read_manifest(reference).classes
    assert back.mean == read_manifest(reference).mean
    # every column of every shard back as it was (sources included); only each file's own name differs
    for s, original in zip(back.shards, read_manifest(reference).shards, strict=True):
        a = torch.load(tmp_path / "p" / s.file, weights_only=True)
        b = torch.load(reference / original.file, weights_only=True)
        assert a.keys() == b.keys() and "source_bytes" in a
        assert all(torch.equal(a[k], b[k]) for k in a if k != "shard_name")
        assert bytes(a["shard_name"].tolist()).decode() == s.file


@pytest.mark.parametrize(
    "fmt, codec, message",
    [("pt", "gzip", "uncompressed"), ("zarr", "lzf", "zarr has lz4"), ("hdf5", "brotli", "must be one of")],
)
def test_unsupported_codecs_are_clear_errors(small_tree, tmp_path, fmt, codec, message):
    with pytest.raises(UsageError, match=message):
        build(small_tree, tmp_path / "c", BuildConfig(format=fmt, compression=codec, size=32, progress=False))


def test_convert_refuses_a_non_empty_out(reference, tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "mine.txt").write_text("keep")
    result = CliRunner().invoke(
        main, ["convert", str(reference), "--to", "zarr", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == 2 and "not empty" in result.output


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = ((a.double() - b.double()) ** 2).mean().item()
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def reference_224(mixed_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref224") / "pt"
    build(mixed_tree, out, BuildConfig(shard_size=3, workers=1, progress=False))
    return out


@pytest.mark.parametrize("fmt", ["pt", "hdf5", "zarr"])
@pytest.mark.parametrize("store", ["jpeg", "png"])
def test_encoded_stores_in_every_format(fmt, store, mixed_tree, reference_224, tmp_path):
    out = tmp_path / "c"
    build(mixed_tree, out, BuildConfig(format=fmt, store=store, shard_size=3, workers=2, progress=False))
    m = read_manifest(out)
    assert m.format_options["store"] == store and (store != "jpeg" or m.format_options["quality"] == 90)
    got, want = _everything(out), _everything(reference_224)
    assert torch.equal(got[1], want[1]) and got[2] == want[2]
    if store == "png":
        assert torch.equal(got[0], want[0])  # lossless
    else:
        assert _psnr(got[0], want[0]) >= 38  # over the whole tree, at quality 90
        assert min(_psnr(a, b) for a, b in zip(got[0], want[0])) >= 34
    ds = CachedDataset(out)
    with ds._reader(0) as reader:
        assert ds.decode_heavy and reader.image_array is None
    assert torch.equal(ds.__getitems__([5, 1]).images, got[0][[5, 1]])
    assert verify(out).ok
    if store == "jpeg":
        assert m.total_bytes < read_manifest(reference_224).total_bytes / 3


def test_jpeg_cache_is_smaller_and_converts_without_re_encoding(mixed_tree, tmp_path):
    build(
        mixed_tree,
        tmp_path / "j",
        BuildConfig(store="jpeg", quality=80, size=48, shard_size=3, workers=1, progress=False),
    )
    convert(tmp_path / "j", tmp_path / "z", "zarr")
    a, b = _everything(tmp_path / "j"), _everything(tmp_path / "z")
    assert torch.equal(a[0], b[0]) and read_manifest(tmp_path / "z").format_options["store"] == "jpeg"


def test_make_loader_decodes_encoded_stores_in_process(small_tree, tmp_path):
    from cachekit import make_loader

    build(small_tree, tmp_path / "j", BuildConfig(store="jpeg", size=32, workers=1, progress=False))
    ds = CachedDataset(tmp_path / "j")
    loader = make_loader(ds, batch_size=8, threads=2, shuffle=False)
    assert loader.num_workers == 0 and "2 threads over each batch" in loader.mode
    images, labels = map(torch.cat, zip(*loader))
    one_by_one = torch.stack([ds[i][0] for i in range(len(ds))])  # decoded on their own
    assert torch.equal(images, one_by_one) and labels.tolist() == [ds[i][1] for i in range(len(ds))]


@pytest.mark.parametrize("fmt", ["pt", "hdf5", "zarr"])
def test_a_swapped_shard_is_refused_without_a_full_checksum(fmt, small_tree, tmp_path):
    import json
    import shutil

    from cachekit import CacheError
    from cachekit.store.atomic import path_size, remove_path, sha256_path

    cache = tmp_path / "c"
    config = BuildConfig(format=fmt, size=32, shard_size=7, order="sorted", workers=1, progress=False)
    build(small_tree, cache, config)
    manifest = listed_manifest(cache)
    first, second = manifest["shards"][0], manifest["shards"][1]
    assert first["samples"] == second["samples"]
    remove_path(cache / first["file"])  # shard 0's file replaced by shard 1's bytes
    (shutil.copytree if fmt == "zarr" else shutil.copy)(cache / second["file"], cache / first["file"])
    first["bytes"], first["sha256"] = path_size(cache / first["file"]), sha256_path(cache / first["file"])
    (cache / "manifest.json").write_text(json.dumps(manifest))  # even a manifest that agrees
    ds = CachedDataset(cache)
    with pytest.raises(CacheError, match=f"{first['file']}: the file holds shard '{second['file']}'"):
        ds[0]
    assert torch.equal(ds[7][0], ds[7][0])  # shard 1 itself is fine
    problems = {p.file: p.problem for p in verify(cache, quick=True).problems}
    assert list(problems) == [first["file"]] and "swapped" in problems[first["file"]]
