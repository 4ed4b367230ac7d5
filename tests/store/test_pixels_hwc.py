"""``--store pixels-hwc``: the same pixels as a cache of planes, kept channels-last.

Every read (``ds[i]``, plain batches, every augmentation path, boxes and masks, workers, verify,
convert) must give exactly what the planes cache gives; the shard's bytes must really be
channels-last; damage must be named.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from manifests import tampered_copy

from cachekit import BuildConfig, CachedDataset, CacheError, build, make_loader, read_manifest
from cachekit.store.formats import get_format
from cachekit.store.manifest import shard_path
from cachekit.tools.convert import convert
from cachekit.tools.report import describe
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.tools.verify import verify
from cachekit.transforms import (
    ColorJitter,
    Mosaic,
    RandAugment,
    RandomAffine,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    RandomZoomOut,
    Resize,
)


def _pair(raw, tmp, name, **options) -> tuple:
    base = dict(workers=1, progress=False, shard_size=5) | options
    planes, hwc = tmp / f"{name}-planes", tmp / f"{name}-hwc"
    build(raw, planes, BuildConfig(**base))
    build(raw, hwc, BuildConfig(store="pixels-hwc", **base))
    return planes, hwc


@pytest.fixture(scope="module")
def pairs(small_tree, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hwc")
    return {
        "ragged": _pair(small_tree, tmp, "ragged", pipeline="train-256", size=48),
        "fixed": _pair(small_tree, tmp, "fixed", pipeline="classification-224", size=40, format="zarr"),
    }


@pytest.fixture(scope="module")
def detect_pair(tmp_path_factory):
    raw = make_object_dataset(tmp_path_factory.mktemp("objects") / "raw", 12, size=(90, 120), classes=3)
    options = dict(annotations="yolo", masks=str(raw / "masks"), pipeline="max-side-512", size=96)
    return _pair(raw, tmp_path_factory.mktemp("hwc-detect"), "det", format="hdf5", **options)


def _batches(cache, **options):
    return list(make_loader(cache, 4, seed=3, shuffle=True, **options))


def _same(a, b) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        assert torch.equal(x[0], y[0])
        if isinstance(x[1], torch.Tensor):
            assert torch.equal(x[1], y[1])
        else:  # detection targets
            for t, u in zip(x[1], y[1]):
                assert t.keys() == u.keys() and all(torch.equal(t[k], u[k]) for k in t)


@pytest.mark.parametrize("kind", ["ragged", "fixed"])
def test_samples_are_the_planes_caches_and_the_bytes_are_channels_last(pairs, kind):
    planes, hwc = pairs[kind]
    m = read_manifest(hwc)
    assert m.format_options["store"] == "pixels-hwc" and m.sample.ragged == (kind == "ragged")
    a, b = CachedDataset(planes), CachedDataset(hwc)
    for i in range(len(a)):
        assert torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1]
    info = m.shards[0]
    reader = get_format(m.format, reading=True).open(
        shard_path(hwc, info), m.sample, info.samples, "pixels-hwc"
    )
    try:
        offsets = np.asarray(reader.column("image_offsets", slice(0, 2)))
        first = np.asarray(reader.column("image_bytes", slice(int(offsets[0]), int(offsets[1]))))
    finally:
        reader.close()
    # the first sample of the shard, as the cache's order has it
    assert np.array_equal(first, b[0][0].numpy().transpose(1, 2, 0).reshape(-1))
    assert verify(hwc).ok
    # `cachekit info` says what a read gives and how the bytes lie
    assert "read channels first, stored channels last" in describe(m)
    assert "stored channels last" not in describe(read_manifest(planes))


@pytest.mark.parametrize("kind", ["ragged", "fixed"])
@pytest.mark.parametrize(
    "steps",
    [
        [RandomResizedCrop(32), RandomHorizontalFlip()],
        [RandomResizedCrop(32, scale=(0.02, 1.0)), RandomVerticalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1)],
        [RandomZoomOut(side_range=(1.0, 2.0)), Resize((36, 36))],
        [RandomAffine(20, scale=(0.5, 1.5), shear=10), Resize((30, 30)), RandAugment(), RandomErasing(0.5)],
    ],
    ids=["rrc", "vflip-jitter", "zoom-out", "affine-stage"],
)
def test_every_augmentation_path_reads_the_same_batches(pairs, kind, steps):
    planes, hwc = pairs[kind]
    _same(_batches(planes, augment=steps, threads=2), _batches(hwc, augment=steps, threads=2))
    _same(_batches(planes, augment=steps, threads=2), _batches(hwc, augment=steps, threads=1))


def test_plain_and_device_batches_and_workers_read_the_same(pairs):
    planes, hwc = pairs["fixed"]
    _same(_batches(planes), _batches(hwc))
    _same(_batches(planes, workers=2), _batches(hwc, workers=2))
    steps = [RandomResizedCrop(32), RandomHorizontalFlip()]
    _same(_batches(planes, augment=steps, device="cpu"), _batches(hwc, augment=steps, device="cpu"))
    planes, hwc = pairs["ragged"]
    _same(_batches(planes, pad=True), _batches(hwc, pad=True))


def test_boxes_masks_and_mosaic_are_the_same(detect_pair):
    planes, hwc = detect_pair
    steps = [Mosaic(64), RandomAffine(10, translate=(0.1, 0.1), scale=(0.5, 1.5)), RandomHorizontalFlip()]
    _same(_batches(planes, augment=steps, threads=2), _batches(hwc, augment=steps, threads=2))
    crop = [RandomResizedCrop(48), RandomHorizontalFlip()]
    _same(_batches(planes, augment=crop, device="cpu"), _batches(hwc, augment=crop, device="cpu"))
    a, b = CachedDataset(planes), CachedDataset(hwc)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x[0], y[0]) and all(torch.equal(x[1][k], y[1][k]) for k in x[1])


@pytest.mark.parametrize("target", ["pt", "hdf5"])
def test_convert_keeps_the_store_and_pixels(pairs, tmp_path, target):
    _, hwc = pairs["fixed"]  # zarr
    out = tmp_path / "converted"
    convert(hwc, out, target)
    assert read_manifest(out).format_options["store"] == "pixels-hwc"
    a, b = CachedDataset(hwc), CachedDataset(out)
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(len(a)))
    assert verify(out).ok


def _tampered(cache, tmp_path, change):
    """A copy of ``cache`` whose first shard's columns went through ``change``, checksums recomputed."""
    return tampered_copy(cache, tmp_path / "tampered", change)


def _shape_of_row(row, shape):
    def change(columns):
        columns["image_shape"][row] = torch.tensor(shape, dtype=columns["image_shape"].dtype)

    return change


def test_a_row_of_another_shape_is_named_by_verify_and_refused_by_reads(small_tree, tmp_path):
    _, hwc = _pair(small_tree, tmp_path, "bad", pipeline="classification-224", size=24, format="pt")
    # the same bytes as another shape: fits the offsets, not the manifest's [3, 24, 24]
    cache = _tampered(hwc, tmp_path, _shape_of_row(1, [3, 12, 48]))
    report = verify(cache)
    assert not report.ok and "row 1 is [3, 12, 48], the manifest says [3, 24, 24]" in str(report.problems[0])
    ds = CachedDataset(cache)
    ds[0]  # another row of the shard reads
    with pytest.raises(CacheError, match=r"is \[3, 12, 48\], the manifest says \[3, 24, 24\]"):
        ds[1]
    with pytest.raises(CacheError, match="the manifest says"):
        list(make_loader(cache, 5, shuffle=False, augment=[RandomResizedCrop(16)]))


def test_a_row_whose_bytes_do_not_hold_its_shape_is_named(small_tree, tmp_path):
    _, hwc = _pair(small_tree, tmp_path, "short", pipeline="train-256", size=24, format="pt")
    cache = _tampered(hwc, tmp_path, _shape_of_row(2, [3, 24, 25]))
    report = verify(cache)
    assert (
        not report.ok and "row 2: its" in str(report.problems[0]) and "[3, 24, 25]" in str(report.problems[0])
    )
    ds = CachedDataset(cache)
    with pytest.raises(CacheError, match="its shape \\[3, 24, 25\\] needs 1800"):
        ds[2]


def _negated_sides(row):
    def change(columns):
        columns["image_shape"][row, 1:] *= -1  # the same byte count, sides below 1

    return change


def _other_channels(row):
    def change(columns):
        c, h, w = columns["image_shape"][row].tolist()
        columns["image_shape"][row] = torch.tensor([1, h, w * c], dtype=columns["image_shape"].dtype)

    return change


@pytest.mark.parametrize(
    ("change", "verified", "read"),
    [
        (_negated_sides, "row 2 records a side below 1", r"sample 2 records the shape \[3, -"),
        (_other_channels, "row 2: its", r"sample 2 records the shape \[1, "),
    ],
    ids=["negative-sides", "other-channels"],
)
def test_a_shape_that_fits_the_bytes_but_not_the_cache_is_named(small_tree, tmp_path, change, verified, read):
    _, hwc = _pair(small_tree, tmp_path, "shape", pipeline="train-256", size=24, format="pt")
    cache = _tampered(hwc, tmp_path, change(2))
    report = verify(cache)
    assert not report.ok and verified in str(report.problems[0])
    ds = CachedDataset(cache)
    ds[0]  # another row of the shard reads
    with pytest.raises(CacheError, match=read):
        ds[2]
    with pytest.raises(CacheError, match=read):
        list(make_loader(cache, 12, shuffle=False, augment=[RandomResizedCrop(16)]))


@pytest.mark.parametrize("store", ["pixels", "pixels-hwc", "png"])
@pytest.mark.parametrize("fmt", ["pt", "hdf5", "zarr"])
def test_a_sample_handed_out_is_the_callers_to_change(small_tree, tmp_path, store, fmt):
    cache = tmp_path / "c"
    config = BuildConfig(workers=1, progress=False, pipeline="train-256", size=24, store=store, format=fmt)
    build(small_tree, cache, config)
    ds = CachedDataset(cache)
    first = ds[0][0]
    kept = first.clone()
    assert first.is_contiguous()
    first.zero_()  # a training script's in-place normalisation, say
    again = ds[0][0]
    assert torch.equal(again, kept) and again.sum() > 0
