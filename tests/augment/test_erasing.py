"""RandomErasing's boxes against torchvision's definition: how often, how large, what aspect, where."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cachekit.augment.erasing import draw_erasing
from cachekit.transforms import RandomErasing

N = 20_000


def test_erasing_frequency_area_and_ratio_as_torchvision():
    h, w = 64, 96
    step = RandomErasing(p=0.5)
    d = draw_erasing(step, 0, 0, np.arange(N), 2000, (h, w))
    assert abs(d.erased.mean() - 0.5) < 0.02  # every box fits at this size: p alone decides
    top, left, bh, bw = d.boxes[d.erased].T.astype(np.float64)
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= h).all() and (left + bw <= w).all()
    assert (bh < h).all() and (bw < w).all()
    area = bh * bw / (h * w)
    # the drawn area is uniform in scale before rounding the sides: its mean, and its range, up to rounding
    assert abs(area.mean() - (0.02 + 0.33) / 2) < 0.01
    assert area.min() > 0.01 and area.max() < 0.36
    log_ratio = np.log(bh / np.maximum(bw, 1))
    lo, hi = math.log(0.3), math.log(3.3)
    inner = (log_ratio > lo + 0.3) & (log_ratio < hi - 0.3)  # away from the ends rounding blurs
    assert abs(inner.mean() - (hi - lo - 0.6) / (hi - lo)) < 0.05  # log-uniform aspect
    # placement uniform over the room left: the centre's mean is the image's centre
    assert abs((top + bh / 2).mean() - h / 2) < 1.0 and abs((left + bw / 2).mean() - w / 2) < 1.0


def test_ten_attempts_then_nothing():
    # a box of at least 90% of the area never fits inside a 4x4 image with both sides strictly smaller
    d = draw_erasing(
        RandomErasing(p=1.0, scale=(0.9, 1.0), ratio=(1.0, 1.0)), 0, 0, np.arange(500), 2000, (4, 4)
    )
    assert not d.erased.any()
    rows = np.full((500, 3, 4, 4), 7, np.uint8)
    for j in range(500):
        d.apply_row(rows[j], j)
    assert (rows == 7).all()


def test_values_constant_per_channel_and_noise():
    x = np.full((4, 3, 40, 40), 100, np.uint8)
    d = draw_erasing(RandomErasing(p=1.0, value=(10, 20, 30)), 0, 0, np.arange(4), 2000, (40, 40))
    for j in range(4):
        row = x[j].copy()
        d.apply_row(row, j)
        top, left, h, w = d.boxes[j]
        assert (row[:, top : top + h, left : left + w] == np.array([10, 20, 30])[:, None, None]).all()
        assert (row == 100).sum() == 3 * (40 * 40 - h * w)
    stats = ((0.5, 0.4, 0.3), (0.2, 0.1, 0.05))
    d = draw_erasing(
        RandomErasing(p=1.0, value="random", scale=(0.3, 0.3)), 0, 0, np.arange(64), 2000, (64, 64), stats
    )
    noise = [d.fill_of(j, 3).reshape(3, -1) for j in range(64) if d.erased[j]]
    z = np.concatenate(noise, axis=1).astype(np.float64) / 255.0
    assert np.allclose(z.mean(axis=1), stats[0], atol=0.01) and np.allclose(
        z.std(axis=1), stats[1], atol=0.01
    )
    again = draw_erasing(
        RandomErasing(p=1.0, value="random", scale=(0.3, 0.3)), 0, 0, np.arange(64), 2000, (64, 64), stats
    )
    assert np.array_equal(d.fill_of(5, 3), again.fill_of(5, 3))  # the same noise for the same sample
    batched = d.apply_batch(torch.full((64, 3, 64, 64), 100.0))
    rows = np.full((64, 3, 64, 64), 100, np.uint8)
    for j in range(64):
        d.apply_row(rows[j], j)
    assert np.array_equal(batched.numpy(), rows)


@pytest.mark.parametrize(
    "kwargs",
    [{"p": 1.5}, {"p": -0.1}, {"p": float("nan")}, {"scale": (0.5, 0.1)}, {"scale": (0.1, 2.0)},
     {"scale": (-1, 0.3)}, {"ratio": (0.0, 1.0)}, {"ratio": (3.0, 1.0)}, {"ratio": (1.0, float("inf"))},
     {"value": "noise"}, {"value": 256}, {"value": (1, 2, 3, 4, 5)}, {"value": float("nan")}],
)  # fmt: skip
def test_hostile_arguments_are_one_line_errors(kwargs):
    with pytest.raises(ValueError) as info:
        RandomErasing(**kwargs)
    assert "\n" not in str(info.value)


def test_every_place_a_box_fits_is_drawn_evenly_up_to_the_last_row_and_column():
    """torchvision places the box at ``randint(0, H - h + 1)``, ``randint(0, W - w + 1)``: the last
    row and column are reached as often as any other (a 2x2 box on an 8x10 image: 7 x 9 places)."""
    h, w = 8, 10
    step = RandomErasing(p=1.0, scale=(0.05, 0.05), ratio=(1.0, 1.0), value=255)  # area 4: a 2x2 box
    d = draw_erasing(step, 3, 1, np.arange(N), 2000, (h, w))
    assert d.erased.all() and (d.boxes[:, 2:] == 2).all()
    top, left = d.boxes[:, 0], d.boxes[:, 1]
    tops, lefts = np.bincount(top, minlength=h - 1), np.bincount(left, minlength=w - 1)
    assert len(tops) == h - 1 and len(lefts) == w - 1  # nothing past the room left
    assert np.abs(tops / N - 1 / (h - 1)).max() < 0.02 and np.abs(lefts / N - 1 / (w - 1)).max() < 0.02
    rows = np.zeros((N, 1, h, w), np.uint8)
    for j in range(200):
        d.apply_row(rows[j], j)
    assert rows[:200, 0, -1, :].any() and rows[:200, 0, :, -1].any()  # the image's last row and column
    assert (rows[:200].reshape(200, -1).sum(1) == 4 * 255).all()
