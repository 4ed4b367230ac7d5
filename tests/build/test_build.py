"""Building real image trees, compared sample by sample with an independent OpenCV reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import BAD_FILES, GOOD_FILES
from reference import chw, classification, letterbox, load_rgb

from cachekit import BuildConfig, CachedDataset, build, read_manifest
from cachekit.store.atomic import path_size

FORMATS = ["pt", "hdf5", "zarr"]


@pytest.fixture(scope="module", params=FORMATS)
def mixed_cache(request, mixed_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"mixed_{request.param}") / "cache"
    build(mixed_tree, out, BuildConfig(format=request.param, workers=2, shard_size=3, progress=False))
    return out


def _index(ds: CachedDataset) -> dict[str, int]:
    """Source path -> sample index (inputs are in a seeded shuffled order)."""
    return {ds.source(i): i for i in range(len(ds))}


def test_every_sample_matches_the_opencv_reference(mixed_cache, mixed_tree):
    ds = CachedDataset(mixed_cache)
    assert len(ds) == len(GOOD_FILES)
    index = _index(ds)
    assert sorted(index) == sorted(GOOD_FILES)
    for rel in GOOD_FILES:
        image, label = ds[index[rel]]
        assert image.dtype.is_floating_point is False and tuple(image.shape) == (3, 224, 224)
        expected = chw(classification(load_rgb(mixed_tree / rel)))
        diff = np.abs(image.numpy().astype(int) - expected.astype(int)).max()
        assert diff <= 1, f"{rel}: max pixel difference {diff}"
        assert label == (0 if rel.startswith("cat/") else 1)
    assert ds.classes == ["cat", "dog"]


def test_exif_orientation_is_applied(mixed_cache, mixed_tree):
    ds = CachedDataset(mixed_cache)
    i = _index(ds)["dog/rotated.jpg"]
    assert ds.extras(i)["orig_size"].tolist() == [240, 320]  # the upright size, not the stored 320x240
    upright = np.load(mixed_tree.parent / "dog_rotated.jpg.upright.npy")
    got = ds[i][0].numpy().astype(float)
    assert np.abs(got - chw(classification(upright))).mean() < 4  # JPEG loss only
    sideways = np.ascontiguousarray(np.rot90(upright))
    assert np.abs(got - chw(classification(sideways))).mean() > 20


def test_bad_inputs_are_skipped_and_listed(mixed_cache):
    m = read_manifest(mixed_cache)
    reasons = {s.path: s.reason for s in m.skipped}
    assert set(reasons) == set(BAD_FILES)
    for path, word in BAD_FILES.items():
        assert word in reasons[path], (path, reasons[path])


def test_manifest_describes_the_cache(mixed_cache, mixed_tree):
    m = read_manifest(mixed_cache)
    assert m.num_samples == len(GOOD_FILES) and m.sample.shape == (3, 224, 224)
    assert m.pipeline["name"] == "classification-224"
    assert m.format_options["shard_size"] == 3 and len(m.shards) == 4
    stacked = np.stack([chw(classification(load_rgb(mixed_tree / p))) for p in GOOD_FILES]).astype(float)
    np.testing.assert_allclose(m.mean, stacked.mean(axis=(0, 2, 3)) / 255, atol=2e-3)
    np.testing.assert_allclose(m.std, stacked.std(axis=(0, 2, 3)) / 255, atol=2e-3)
    for shard in m.shards:
        assert path_size(mixed_cache / shard.file) == shard.bytes
    raw = json.loads((mixed_cache / "manifest.json").read_text())  # shards in the index it names
    assert raw["format_version"] == 5 and "shards" not in raw and len(raw["fingerprint"]) == 64
    assert raw["index"]["shards"] == len(m.shards) and (mixed_cache / raw["index"]["file"]).is_file()


def test_letterbox_records_scale_and_padding(mixed_tree, tmp_path):
    out = tmp_path / "lb"
    build(mixed_tree, out, BuildConfig(pipeline="letterbox-640", size=160, workers=1, progress=False))
    ds = CachedDataset(out)
    for rel, i in _index(ds).items():
        expected, scale, left, top = letterbox(load_rgb(mixed_tree / rel), 160)
        image, _ = ds[i]
        assert np.abs(image.numpy().astype(int) - chw(expected).astype(int)).max() <= 1, rel
        extras = ds.extras(i)
        assert extras["pad"].tolist() == [left, top]
        assert extras["scale"] == pytest.approx(scale, rel=1e-6)


def test_size_override_rescales_the_recipe(small_tree, tmp_path):
    build(small_tree, tmp_path / "c", BuildConfig(size=64, workers=1, progress=False))
    m = read_manifest(tmp_path / "c")
    assert m.sample.shape == (3, 64, 64)
    assert m.pipeline["steps"][0] == {"op": "resize_shorter", "size": 73}


def test_builds_are_byte_identical_whatever_the_worker_count(small_tree, tmp_path):
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        build(small_tree, out, BuildConfig(size=32, shard_size=6, workers=workers, progress=False))
        outs.append(out)
    a, b = (read_manifest(o) for o in outs)
    assert a.to_json() | {"created": ""} == b.to_json() | {"created": ""}
    for shard in a.shards:
        assert (outs[0] / shard.file).read_bytes() == (outs[1] / shard.file).read_bytes()


def test_flat_folder_and_labels_csv(small_tree, tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    files = sorted(small_tree.glob("*/*.jpg"))[:5]
    for f in files:
        (flat / f.name).write_bytes(f.read_bytes())
    build(flat, tmp_path / "c1", BuildConfig(size=32, workers=1, progress=False))
    ds = CachedDataset(tmp_path / "c1")
    assert len(ds) == 5 and {ds[i][1] for i in range(5)} == {-1} and ds.classes == []

    csv = tmp_path / "labels.csv"
    csv.write_text(
        "file,label\n" + "".join(f"{f.name},{'zebra' if i % 2 else 'ant'}\n" for i, f in enumerate(files))
    )
    build(flat, tmp_path / "c2", BuildConfig(size=32, labels=csv, workers=1, progress=False))
    ds = CachedDataset(tmp_path / "c2")
    assert ds.classes == ["ant", "zebra"]
    expected = {f.name: i % 2 for i, f in enumerate(files)}
    assert {ds.source(i): ds[i][1] for i in range(5)} == expected


def test_rerun_is_up_to_date_and_rewrites_nothing(small_tree, tmp_path):
    out = tmp_path / "c"
    build(small_tree, out, BuildConfig(size=32, workers=1, progress=False))
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    result = build(small_tree, out, BuildConfig(size=32, workers=1, progress=False))
    assert result.status == "up to date"
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_overwrite_replaces_a_different_cache(small_tree, tmp_path):
    out = tmp_path / "c"
    old = build(small_tree, out, BuildConfig(size=32, workers=1, progress=False)).manifest
    result = build(
        small_tree, out, BuildConfig(size=40, format="hdf5", overwrite=True, workers=1, progress=False)
    )
    m = read_manifest(out)
    assert m.format == "hdf5" and m.sample.shape == (3, 40, 40)
    # the old version's shards stay for its readers, recorded as retired, until a later build
    assert result.retired == len(old.shards) + 1  # and its index
    retired = json.loads((out / ".cachekit-retired.json").read_text())["files"]
    assert sorted(retired) == sorted([old.index["file"], *(s.file for s in old.shards)])
    kept = sorted(p.name for p in [*out.glob("shard-*"), *out.glob("index-*")])
    assert kept == sorted([*retired, m.index["file"], *(s.file for s in m.shards)])
    again = build(small_tree, out, BuildConfig(size=40, format="hdf5", grace=0, workers=1, progress=False))
    assert again.status == "up to date" and again.removed == len(old.shards) + 1
    assert sorted(p.name for p in out.glob("shard-*")) == sorted(s.file for s in m.shards)
    assert not (out / ".cachekit-retired.json").exists()


@pytest.mark.parametrize("compression", ["gzip", "lzf"])
def test_compressed_hdf5_reads_the_same_pixels(small_tree, small_cache, tmp_path, compression):
    config = BuildConfig(
        format="hdf5",
        compression=compression,
        size=32,
        shard_size=7,
        order="sorted",
        workers=1,
        progress=False,
    )
    build(small_tree, tmp_path / "c", config)
    packed, plain = CachedDataset(tmp_path / "c"), CachedDataset(small_cache)
    with packed._reader(0) as reader:
        assert reader.image_array is None  # compressed chunks go through h5py, not the memory map
    order = [39, 0, 17, 17, 5, 22]
    for a, b in zip(packed.read_batch(order), plain.read_batch(order)):
        assert torch.equal(a, b)
    assert read_manifest(tmp_path / "c").format_options["compression"] == compression
