"""Variable-sized samples: stored at their own size in every format, padded or refused when batched."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import GOOD_FILES
from reference import chw, load_rgb

from cachekit import BuildConfig, CachedDataset, UsageError, build, make_loader, pad_collate, read_manifest
from cachekit.store.formats import get_format
from cachekit.store.manifest import shard_path
from cachekit.tools.convert import convert
from cachekit.tools.verify import verify


@pytest.mark.parametrize("fmt", ["pt", "hdf5", "zarr"])
@pytest.mark.parametrize("store", ["pixels", "pixels-hwc", "png"])
def test_pipeline_none_keeps_every_image_at_its_own_size(mixed_tree, tmp_path, fmt, store):
    out = tmp_path / "c"
    build(
        mixed_tree,
        out,
        BuildConfig(pipeline="none", format=fmt, store=store, shard_size=3, workers=2, progress=False),
    )
    m = read_manifest(out)
    assert m.sample.ragged and m.sample.to_json()["shape"] == [3, None, None]
    ds = CachedDataset(out)
    assert len(ds) == len(GOOD_FILES)
    index = {ds.source(i): i for i in range(len(ds))}
    assert sorted(index) == sorted(GOOD_FILES)
    for rel, i in index.items():
        image, label = ds[i]
        expected = chw(load_rgb(mixed_tree / rel))  # no resize: exactly the decoded, upright image
        assert tuple(image.shape) == expected.shape
        assert np.abs(image.numpy().astype(int) - expected.astype(int)).max() <= 1, rel
        assert label == (0 if rel.startswith("cat/") else 1)
    pixels = sum(int(np.prod(ds[i][0].shape[1:])) for i in range(len(ds)))
    assert sum(s.pixel_count for s in m.shards) == pixels
    assert verify(out).ok
    # the shard's image bytes (most of it) are mapped, not copied into each reader process
    info = m.shards[0]
    reader = get_format(fmt, reading=True).open(shard_path(out, info), m.sample, info.samples, store)
    try:
        root = reader.column("image_bytes", slice(None))
        while isinstance(root.base, np.ndarray):  # down to the array that holds the bytes
            root = root.base
        assert not root.flags.owndata and root.base is not None  # a view of a map, not numpy's memory
    finally:
        reader.close()


def test_batches_of_ragged_samples_pad_or_say_why_not(mixed_tree, tmp_path):
    out = tmp_path / "c"
    build(mixed_tree, out, BuildConfig(pipeline="max-side-512", size=64, workers=1, progress=False))
    ds = CachedDataset(out)
    sizes = [tuple(ds[i][0].shape) for i in range(len(ds))]
    assert len(set(sizes)) > 1 and all(max(s[1:]) == 64 for s in sizes)
    with pytest.raises(ValueError, match="pad=True"):
        ds.read_batch([0, 1, 2])
    with pytest.raises(ValueError, match="own size: pass pad=True"):
        make_loader(ds, batch_size=4, shuffle=False)  # said at once, not at the first batch
    loader = make_loader(ds, batch_size=4, shuffle=False, pad=True)
    seen = 0
    for images, labels, hw in loader:
        assert images.shape[2:] == (int(hw[:, 0].max()), int(hw[:, 1].max()))
        for k in range(len(labels)):
            h, w = hw[k].tolist()
            own = ds[seen + k][0]
            assert torch.equal(images[k, :, :h, :w], own) and images[k, :, h:, :].sum() == 0
        seen += len(labels)
    assert seen == len(ds)
    images, labels, hw = pad_collate([ds[0], ds[1]])
    assert images.shape[0] == 2 and hw.tolist() == [list(ds[0][0].shape[1:]), list(ds[1][0].shape[1:])]


def test_ragged_caches_convert_and_refuse_augmentation(mixed_tree, tmp_path):
    build(mixed_tree, tmp_path / "c", BuildConfig(pipeline="none", workers=1, progress=False))
    convert(tmp_path / "c", tmp_path / "z", "zarr", compression="zstd")
    a, b = CachedDataset(tmp_path / "c"), CachedDataset(tmp_path / "z")
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(len(a)))
    with pytest.raises(UsageError, match="fixed output size"):
        build(mixed_tree, tmp_path / "x", BuildConfig(pipeline="none", augment=2, progress=False))
