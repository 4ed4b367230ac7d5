"""One walk of a list's geometry: each step's map and, for crops, resizes and flips, the exact crop rects."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit.augment.geometric import RandomRotation, RandomVerticalFlip
from cachekit.augment.maps import draw_maps
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import (
    CenterCrop,
    ColorJitter,
    Letterbox,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from cachekit.constants import MAX_SIDE

FAST_LISTS = [
    [RandomResizedCrop(32)],
    [RandomResizedCrop((24, 40), scale=(0.2, 1.0)), RandomHorizontalFlip()],
    [Resize(40), RandomResizedCrop(24), RandomHorizontalFlip()],
    [RandomHorizontalFlip(1.0), RandomResizedCrop(32, scale=(0.1, 0.5)), CenterCrop(21)],
    [RandomHorizontalFlip(), RandomResizedCrop(30), RandomHorizontalFlip(), CenterCrop((17, 25))],
    [RandomResizedCrop(31), CenterCrop(19), ColorJitter(0.2)],
    [Letterbox(48)],
    [Resize((50, 70)), CenterCrop(44)],
    [CenterCrop(200)],  # larger than the image: padded
    [RandomResizedCrop(32), Resize((20, 24)), RandomHorizontalFlip()],  # a resize after a crop: no pre
]


def _sizes(n: int) -> tuple[np.ndarray, np.ndarray]:
    return 60 + 13 * (np.arange(n) % 4), 90 + 7 * (np.arange(n) % 5)


@pytest.mark.parametrize("steps", FAST_LISTS, ids=lambda s: "+".join(type(t).__name__ for t in s))
def test_walk_carries_crop_rects_that_agree_with_each_sample_map(steps):
    """The crop+resize path's rects come from the same walk as the maps: each rect is the composed
    map's source rect within half a pixel per edge, its flip is the map's mirror, and the plan's
    draws are exactly these rects."""
    n = 40
    idx = np.arange(100, 100 + n)
    h, w = _sizes(n)
    plan = compile_plan(steps)
    maps = draw_maps(plan.steps, 7, 2, idx, h, w)
    crops = maps.crops
    assert crops is not None and maps.warps is None and maps.fast is None
    draws = plan.draw(7, 2, idx, h, w)
    assert draws.general is None
    assert np.array_equal(draws.boxes, crops.boxes) and np.array_equal(draws.flips, crops.flips)
    assert np.array_equal(crops.flips, maps.matrices[:, 0, 0] < 0)
    oh, ow = maps.out_size
    assert (oh, ow) == draws.out_size
    # where the output's corners come from, in the pixels the rects are in (the resized image's with pre)
    inv = np.linalg.inv(maps.matrices)
    corners = np.stack([inv @ np.array([0.0, 0.0, 1.0]), inv @ np.array([ow, oh, 1.0])], axis=1)  # [n, 2, 3]
    xs, ys = corners[..., 0] / corners[..., 2], corners[..., 1] / corners[..., 2]
    if crops.pre is not None:
        assert np.array_equal(draws.pre, crops.pre)
        xs, ys = xs * (crops.pre[:, 1:2] / w[:, None]), ys * (crops.pre[:, 0:1] / h[:, None])
    top, left, bh, bw = crops.boxes.T
    assert np.allclose(ys.min(1), top, atol=0.5 + 1e-9) and np.allclose(xs.min(1), left, atol=0.5 + 1e-9)
    assert np.allclose(ys.max(1), top + bh, atol=1.0 + 1e-9) and np.allclose(xs.max(1), left + bw, atol=1.0 + 1e-9)
    assert (bh >= 1).all() and (bw >= 1).all()


def test_a_mirrored_view_is_cropped_on_its_mirrored_side():
    """A crop after a certain flip is drawn in the mirrored view: in source pixels it lies on the
    other side (a crop of the left edge of the mirror is the right edge of the image)."""
    idx, h, w = np.arange(64), np.full(64, 40), np.full(64, 100)
    crop = RandomResizedCrop(16, scale=(0.05, 0.3))
    mirrored = draw_maps((RandomHorizontalFlip(1.0), crop), 0, 0, idx, h, w).crops
    plain = draw_maps((RandomHorizontalFlip(0.0), crop), 0, 0, idx, h, w).crops  # the same streams
    assert mirrored.flips.all() and not plain.flips.any()
    top, left, bh, bw = plain.boxes.T
    assert (left + bw < 100 - left).any()  # some crops off the centre: the test tells the sides apart
    assert np.array_equal(mirrored.boxes, np.stack([top, 100 - left - bw, bh, bw], axis=1))
    rects = draw_maps((RandomHorizontalFlip(1.0), Letterbox(20), CenterCrop((20, 4))), 0, 0, idx, h, w).crops
    # the letterbox shows 100 x 100 source pixels (30 rows of fill above and below), the central 4 of
    # its 20 columns are 20 source columns
    assert rects.boxes[0].tolist() == [-30, 40, 100, 20]


def test_a_general_list_carries_no_rects_and_draws_its_warp():
    idx, h, w = np.arange(6), np.full(6, 40), np.full(6, 60)
    maps = draw_maps((RandomResizedCrop(32), RandomRotation(30)), 1, 0, idx, h, w)
    assert maps.crops is None and maps.warps is not None
    flipped = draw_maps((RandomResizedCrop(32), RandomVerticalFlip(1.0)), 1, 0, idx, h, w)
    assert flipped.crops is None and flipped.fast is not None and flipped.fast[2].all()


def test_an_output_past_the_largest_side_is_one_line_on_the_crop_path_too():
    """``Resize(int)`` keeps the aspect ratio: a long thin image's long side would pass MAX_SIDE."""
    plan = compile_plan([Resize(MAX_SIDE // 2)])
    with pytest.raises(ValueError, match="past the largest side"):
        plan.draw(0, 0, [0], [10], [100])


def test_crops_of_a_resized_crop_compose_exactly_and_round_once():
    """45 x 45 pixels: the central 40 (from 2), resized to 30, its central 15 (from 8 of 30): in source
    pixels from 2 + 8 * 4 / 3 = 12.67, 20 tall, rounded once at the end to 13 and 20 (never a crop
    rounded on its own before the next is drawn, nor truncated)."""
    steps = (CenterCrop(40), Resize((30, 30)), CenterCrop(15))
    rects = draw_maps(steps, 0, 0, np.arange(2), [45, 45], [45, 45]).crops
    assert rects.pre is None and rects.boxes.tolist() == [[13, 13, 20, 20]] * 2
    first = draw_maps((Resize((30, 30)), CenterCrop(15)), 0, 0, np.arange(1), [45], [45]).crops
    assert first.pre.tolist() == [[30, 30]] and first.boxes.tolist() == [[8, 8, 15, 15]]  # in the resized image
