"""A loader that needs a fixed output size says so in one line naming every step that sets one,
``Letterbox`` among them (what a detection or pose user reaches for), and each of them then reads."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.maps import draw_maps
from cachekit.augment.plan import compile_plan
from cachekit.constants import MAX_SIDE
from cachekit.transforms import (
    CenterCrop,
    Letterbox,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomZoomOut,
    Resize,
)

#: What every refusal names, in this order.
STEPS = "Letterbox, RandomResizedCrop, CenterCrop or Resize((height, width))"
ENDINGS = [Letterbox(48), RandomResizedCrop(48), CenterCrop(32), Resize((48, 40))]


def _pose_cache(out, **recipe) -> CachedDataset:
    rng = np.random.default_rng(5)
    samples = []
    for _ in range(4):
        points = np.array([[[12.0, 10.0, 2.0], [30.0, 10.0, 2.0]]], np.float32)
        target = {"boxes": np.array([[4, 4, 40, 30]], np.float32), "classes": [0], "keypoints": points}
        samples.append((rng.integers(0, 256, (40, 50, 3), dtype=np.uint8), target))
    build(samples, out, BuildConfig(workers=1, progress=False, **recipe), classes=1, flip_idx=[1, 0])
    return CachedDataset(out)


@pytest.fixture(scope="module")
def pose(tmp_path_factory):
    """A ``--pipeline none`` pose cache of samples all of one size (so each kept at its own size)."""
    return _pose_cache(tmp_path_factory.mktemp("pose") / "cache", pipeline="none")


@pytest.fixture(scope="module")
def square(tmp_path_factory):
    """The same samples letterboxed to 48 x 48 when built: one size for every sample."""
    return _pose_cache(tmp_path_factory.mktemp("square") / "cache", pipeline="letterbox-640", size=48)


def _said(call) -> str:
    with pytest.raises(ValueError) as caught:
        call()
    text = str(caught.value)
    assert "\n" not in text
    return text


def test_a_cache_of_own_sized_samples_names_letterbox_and_each_ending_reads(pose):
    assert pose.ragged
    text = _said(lambda: make_loader(pose, 2))
    assert text.endswith(f"or an augment ending in a fixed size ({STEPS})"), text
    text = _said(lambda: make_loader(pose, 2, augment=[RandomHorizontalFlip()]))
    assert f"must then end in a fixed size ({STEPS}): pad=True" in text, text
    for ending in ENDINGS:
        images, targets = next(
            iter(make_loader(pose, 2, augment=[RandomHorizontalFlip(), ending], shuffle=False))
        )
        assert images.shape[0] == 2 and targets[0]["keypoints"].shape == (1, 2, 3), ending


def test_sizes_that_vary_after_a_step_name_letterbox_and_each_ending_reads(square):
    assert not square.ragged
    text = _said(lambda: make_loader(square, 2, augment=[RandomZoomOut(p=1.0)]))
    assert text.endswith(f"with no fixed size after it): end it with {STEPS}"), text
    for ending in ENDINGS:
        images, _ = next(iter(make_loader(square, 2, augment=[RandomZoomOut(p=1.0), ending])))
        assert images.shape[0] == 2, ending


def test_the_maps_refusals_name_letterbox():
    steps = compile_plan([RandomHorizontalFlip()]).steps
    text = _said(lambda: draw_maps(steps, 0, 0, np.arange(2), [40, 40], [50, 51]))
    assert text.endswith(f"end it with {STEPS}"), text
    text = _said(lambda: draw_maps(steps, 0, 0, [0], [MAX_SIDE + 1], [8]))
    assert text.endswith(f"{MAX_SIDE}: end it with {STEPS}"), text
