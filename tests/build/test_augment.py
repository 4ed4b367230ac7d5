"""Offline augmentation: reproducible variants, batched colour ops against per-image references."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance

from cachekit import (
    BuildConfig,
    CachedDataset,
    ShardAwareDistributedSampler,
    UsageError,
    build,
    read_manifest,
)
from cachekit.build.inputorder import input_key
from cachekit.build.offline_variants import AugmentConfig, variant_params
from cachekit.image import ops
from cachekit.tools.synthetic import synthetic_image

K = 3


def _build(tree, out, **kw):
    config = BuildConfig(size=32, workers=1, progress=False, augment=K, **kw)
    return build(tree, out, config)


@pytest.fixture(scope="module")
def augmented(small_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("aug") / "cache"
    _build(small_tree, out, seed=11, shard_size=5, augment_rotate=10)
    return out


def _by_source(cache):
    """(source path, variant) -> (image, label) of every sample."""
    ds = CachedDataset(cache)
    images, labels = ds.read_batch(np.arange(len(ds)))
    return {(ds.source(i), int(ds.extras(i)["variant"])): (images[i], int(labels[i])) for i in range(len(ds))}


def _all(cache):
    ds = CachedDataset(cache)
    return ds.read_batch(np.arange(len(ds)))


def test_variants_are_stored_side_by_side_with_their_source(augmented):
    ds = CachedDataset(augmented)
    assert len(ds) == 40 * K and ds.group_size == K
    m = read_manifest(augmented)
    assert m.pipeline["augment"]["variants"] == K and m.pipeline["augment"]["seed"] == 11
    assert m.pipeline["augment"]["rotate"] == 10
    images, labels = _all(augmented)
    for i in range(0, len(ds), 7):
        extras, first = ds.extras(i), (i // K) * K
        assert int(extras["variant"]) == i % K
        assert int(extras["input_key"]) == int(ds.extras(first)["input_key"]) == input_key(ds.source(i))
        assert ds.source(i) == ds.source(first)
        assert labels[i] == labels[first]  # every variant keeps its input's label
    first = images[0:K]
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])


def test_same_seed_reproduces_byte_for_byte_and_another_seed_differs(small_tree, augmented, tmp_path):
    # another worker count and another shard layout: the samples are the same
    # (another shard count puts inputs in other shards and another order, each with the same variants)
    _build(small_tree, tmp_path / "again", seed=11, shard_size=7, augment_rotate=10)
    a, b = _by_source(augmented), _by_source(tmp_path / "again")
    assert a.keys() == b.keys() and all(torch.equal(a[k][0], b[k][0]) and a[k][1] == b[k][1] for k in a)
    a = _all(augmented)
    build(
        small_tree,
        tmp_path / "w2",
        BuildConfig(size=32, workers=2, progress=False, augment=K, seed=11, shard_size=5, augment_rotate=10),
    )
    m1, m2 = read_manifest(augmented), read_manifest(tmp_path / "w2")
    for s in m1.shards:
        assert (augmented / s.file).read_bytes() == (tmp_path / "w2" / s.file).read_bytes()
    assert [s.file for s in m1.shards] == [s.file for s in m2.shards]
    _build(small_tree, tmp_path / "other", seed=12, shard_size=5, augment_rotate=10)
    c = _all(tmp_path / "other")
    assert not torch.equal(a[0], c[0])


def test_letterbox_refuses_augmentation(small_tree, tmp_path):
    with pytest.raises(UsageError, match="cannot keep"):
        build(
            small_tree,
            tmp_path / "c",
            BuildConfig(pipeline="letterbox-640", size=64, augment=2, progress=False),
        )


def test_crop_parameters_follow_random_resized_crop():
    config = AugmentConfig(variants=50, seed=3)
    for v in range(50):
        p = variant_params(config, 9, v, 300, 400)
        assert 0 <= p.top and p.top + p.height <= 300 and 0 <= p.left and p.left + p.width <= 400
        area = p.height * p.width / (300 * 400)
        assert 0.07 <= area <= 1.0 and 0.7 <= p.width / p.height <= 1.4
        assert 0.6 <= p.brightness <= 1.4 and -0.1 <= p.hue <= 0.1
    assert variant_params(config, 9, 4, 300, 400) == variant_params(config, 9, 4, 300, 400)
    assert variant_params(config, 9, 4, 300, 400) != variant_params(config, 10, 4, 300, 400)


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    return np.stack([synthetic_image(rng, 24, 20) for _ in range(6)])


FACTORS = np.array([0.5, 0.8, 1.0, 1.2, 1.4, 0.65])


def _max_diff(a, b):
    return int(np.abs(a.astype(int) - b.astype(int)).max())


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (ops.adjust_brightness_batch, ImageEnhance.Brightness),
        (ops.adjust_contrast_batch, ImageEnhance.Contrast),
        (ops.adjust_saturation_batch, ImageEnhance.Color),
    ],
    ids=["brightness", "contrast", "saturation"],
)
def test_colour_ops_match_pil_per_image(batch, ours, theirs):
    got = ours(batch, FACTORS)
    for img, f, out in zip(batch, FACTORS, got):
        expected = np.asarray(theirs(Image.fromarray(img)).enhance(float(f)))
        assert _max_diff(out, expected) <= 2


def test_flip_matches_per_image(batch):
    flip = np.array([True, False, True, True, False, False])
    got = ops.hflip_batch(batch, flip)
    for img, f, out in zip(batch, flip, got):
        assert np.array_equal(out, img[:, ::-1] if f else img)


def test_hue_matches_a_per_pixel_reference(batch):
    shifts = np.array([0.1, -0.1, 0.0, 0.25, -0.5, 0.05])
    got = ops.adjust_hue_batch(batch, shifts)
    for img, s, out in zip(batch, shifts, got):
        ref = np.empty_like(img)
        for y in range(img.shape[0]):
            for x in range(img.shape[1]):
                h, sat, v = colorsys.rgb_to_hsv(*(img[y, x] / 255.0))
                ref[y, x] = np.round(np.array(colorsys.hsv_to_rgb((h + s) % 1.0, sat, v)) * 255)
        # OpenCV's 8-bit HSV quantises hue to 1/256 of a turn: a few levels on saturated pixels
        assert np.abs(out.astype(int) - ref.astype(int)).mean() < 1.5 and _max_diff(out, ref) <= 12


def test_sampler_keeps_variants_of_an_image_on_one_rank(augmented):
    ds = CachedDataset(augmented)
    for world in (2, 3):
        ranks = [
            list(ShardAwareDistributedSampler(ds, num_replicas=world, rank=r, seed=1)) for r in range(world)
        ]
        assert len({len(r) for r in ranks}) == 1 and len(ranks[0]) % K == 0
        owners = {}
        for r, indices in enumerate(ranks):
            for i in indices:
                owners.setdefault(i // K, set()).add(r)
        assert set(owners) == set(range(40))  # every image is covered
        padded = sum(len(r) for r in ranks) - len(ds)
        split = [g for g, rs in owners.items() if len(rs) > 1]
        assert len(split) * K <= padded  # only the repeated padding groups appear twice
        for indices in ranks:
            groups = [i // K for i in indices]
            assert groups != sorted(groups)  # the rank's share is shuffled, not K in a row
            # one image's variants are spread out: no batch of 8 holds two of them
            assert all(len(set(groups[i : i + 8])) == len(groups[i : i + 8]) for i in range(len(groups)))
