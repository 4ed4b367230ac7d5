"""``make_loader(channels_last=True)``: the same values, channels-last memory, written that way.

Crops, resizes and flips on the threads write each sample straight into its row of an NHWC block
(no planes in between); recipes with warps, colour jitter, a pixel stage or mixing are converted
once at the end. Either way the batch must equal the default one and be channels-last; a held
batch must never be overwritten by later ones (the pooled blocks are reused).
"""

from __future__ import annotations

import pytest
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.feed.assemble import BatchRequest
from cachekit.transforms import (
    CenterCrop,
    ColorJitter,
    MixUp,
    RandAugment,
    RandomAffine,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    RandomZoomOut,
    Resize,
)

RECIPES = {
    "rrc-flip": [RandomResizedCrop(40, scale=(0.05, 1.0)), RandomHorizontalFlip()],
    "vflip": [RandomResizedCrop(40), RandomVerticalFlip()],
    "resize-crop-pad": [Resize(60), CenterCrop(72)],  # a crop past the image: fill around it
    "zoom-out": [RandomZoomOut(side_range=(1.0, 2.0)), Resize((40, 40)), RandomHorizontalFlip()],
    "affine": [RandomAffine(20, scale=(0.5, 1.5)), Resize((40, 40))],
    "jitter": [RandomResizedCrop(40), ColorJitter(0.4, 0.4, 0.4, 0.1)],
    "stage": [RandomResizedCrop(40), RandAugment(), RandomErasing(0.5)],
    "mixup": [RandomResizedCrop(40), MixUp(0.4, num_classes=4)],
}
NATIVE = {"rrc-flip", "vflip", "resize-crop-pad", "zoom-out"}


@pytest.fixture(scope="module")
def caches(small_tree, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cl")
    out = {}
    for store in ("pixels", "pixels-hwc"):
        out[store] = tmp / store
        build(small_tree, out[store], BuildConfig(pipeline="train-256", size=56, store=store, shard_size=9,
                                                  workers=1, progress=False))  # fmt: skip
    return out


@pytest.mark.parametrize("store", ["pixels", "pixels-hwc"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_channels_last_batches_equal_the_default_ones(caches, store, recipe):
    steps = RECIPES[recipe]
    plain = list(make_loader(caches[store], 8, seed=5, augment=steps, threads=2))
    last = list(make_loader(caches[store], 8, seed=5, augment=steps, threads=2, channels_last=True))
    assert len(plain) == len(last) == 5
    for (x, y), (u, v) in zip(plain, last):
        assert x.is_contiguous() and u.is_contiguous(memory_format=torch.channels_last)
        assert not u.is_contiguous()
        assert torch.equal(x, u) and torch.equal(y, v)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_crops_are_written_channels_last_and_the_rest_as_planes(caches, recipe):
    ds = CachedDataset(caches["pixels-hwc"])
    request = BatchRequest(range(8), plan=compile_plan(RECIPES[recipe]), threads=2, channels_last=True)
    images = ds.read_request(request).images
    expected = torch.channels_last if recipe in NATIVE else torch.contiguous_format
    assert images.is_contiguous(memory_format=expected)
    same = ds.read_request(BatchRequest(range(8), plan=compile_plan(RECIPES[recipe]), threads=2)).images
    assert torch.equal(images, same)


def test_a_held_batch_is_never_overwritten(caches):
    steps = RECIPES["rrc-flip"]
    loader = make_loader(caches["pixels-hwc"], 8, seed=1, augment=steps, threads=2, channels_last=True)
    held = [(x, x.clone()) for x, _ in loader]  # every batch of the pass held at once
    for _ in range(2):  # later passes reuse only blocks nobody holds
        for _ in loader:
            pass
    assert all(torch.equal(x, copy) for x, copy in held)
    assert len({x.data_ptr() for x, _ in held}) == len(held)
