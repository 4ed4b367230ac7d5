"""The per-sample stage as compiled from a list: its place in the plan, its draws (from seed, epoch, index
alone), the rows and the batched torch path agreeing, and every argument checked in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cachekit.augment.plan import compile_plan
from cachekit.image.instances import Instances
from cachekit.tools.synthetic import synthetic_image
from cachekit.transforms import (
    AutoAugment,
    ColorJitter,
    CutMix,
    GaussianBlur,
    MixUp,
    RandAugment,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
    RandomResizedCrop,
    TrivialAugmentWide,
)

EVERY = [
    RandAugment(3, 12),
    TrivialAugmentWide(),
    AutoAugment("cifar10", fill=(20, 40, 60)),
    RandomGrayscale(0.3),
    GaussianBlur((5, 3), sigma=(0.5, 3.0)),
    RandomHSV(),
    RandomErasing(0.7, value=(1, 2, 3)),
    RandomErasing(0.7, value="random"),
]


def _rows(n: int, h: int = 36, w: int = 44) -> np.ndarray:
    rng = np.random.default_rng(11)
    return np.stack([synthetic_image(rng, h, w).transpose(2, 0, 1) for _ in range(n)]).copy()


def test_plan_keeps_geometry_stage_and_mixing_apart():
    plan = compile_plan(
        [RandomResizedCrop(32), RandomHorizontalFlip(), ColorJitter(0.2), RandAugment(), MixUp()]
    )
    assert [type(s).__name__ for s in plan.steps] == [
        "RandomResizedCrop",
        "RandomHorizontalFlip",
        "ColorJitter",
    ]
    assert [type(s).__name__ for _, s in plan.stage.steps] == ["RandAugment"]
    assert plan.mix is not None and plan.mix.mixup_alpha is None  # auto: by the cache's kind
    only = compile_plan([RandAugment()])
    assert only.steps == () and only.mix is None and only.fixed_size() is None
    d = only.draw(0, 0, [0, 1], [30, 30], [40, 40])
    assert d.out_size == (30, 40)
    with pytest.raises(TypeError, match="RandAugment"):
        compile_plan([3])
    with pytest.raises(ValueError, match=r"the function .*<lambda> in the augment list: wrap it as PixelOp"):
        compile_plan([lambda x: x])


def test_rows_and_batch_agree_and_draws_are_per_sample():
    plan = compile_plan([RandomResizedCrop(36), *EVERY])
    n = 48
    idx = np.arange(100, 100 + n)
    stats = ((0.4, 0.5, 0.6), (0.2, 0.2, 0.2))
    draws = plan.stage.draw(7, 2, idx, (36, 44), stats)
    rows = _rows(n)
    cpu = rows.copy()
    for j in range(n):
        draws.apply_row(cpu[j], j)
    batched = draws.apply_batch(torch.from_numpy(rows).float()).numpy()
    diff = np.abs(batched - cpu)
    # eight transforms in a row: a level of rounding here and there, which HSV's 8-bit hue may widen
    assert (diff > 1).mean() < 0.01 and diff.mean() < 0.05, ((diff > 1).mean(), diff.mean())
    assert not np.array_equal(cpu, rows)
    # sample 5 drawn alone, in another batch: the very same row
    alone = plan.stage.draw(7, 2, idx[5:6], (36, 44), stats)
    row = rows[5].copy()
    alone.apply_row(row, 0)
    assert np.array_equal(row, cpu[5])
    other = plan.stage.draw(7, 3, idx, (36, 44), stats)
    again = rows.copy()
    for j in range(n):
        other.apply_row(again[j], j)
    assert not np.array_equal(again, cpu)


def test_one_channel_rows_pass_through_colour_only_ops():
    plan = compile_plan([RandomGrayscale(1.0), RandomHSV(), RandAugment(2, 9)])
    draws = plan.stage.draw(0, 0, np.arange(16), (20, 24))
    rows = _rows(16, 20, 24)[:, :1].copy()
    cpu = rows.copy()
    for j in range(16):
        draws.apply_row(cpu[j], j)
    batched = draws.apply_batch(torch.from_numpy(rows).float()).numpy()
    assert np.abs(batched - cpu).max() <= 1


def test_boxes_follow_the_stage_maps():
    plan = compile_plan([RandAugment(2, 20)])
    draws = plan.stage.draw(1, 0, np.arange(64), (60, 80))
    moved = [j for j in range(64) if draws.matrices(j)]
    assert moved
    objects = Instances(np.tile([[30.0, 20.0, 50.0, 36.0]], (64, 1)), np.full(64, 2), np.zeros(64), np.arange(64))
    masks = [np.zeros((60, 80), np.uint8) for _ in range(64)]
    for m in masks:
        m[20:36, 30:50] = 3
    carried = draws.carry(objects, 64, 0.0)
    spans = carried.spans(64)
    for j in range(64):
        draws.move_mask(masks[j], j)
        ys, xs = np.nonzero(masks[j])
        a, b = spans[j]
        if not len(xs):
            assert a == b
            continue
        region = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])
        box = carried.boxes[a]
        assert (box[:2] <= region[:2] + 1).all() and (box[2:] >= region[2:] - 1).all(), j  # round it
        if len(draws.matrices(j)) == 1:  # one map: the box round the moved shape, to a pixel (a second
            assert np.abs(box - region).max() <= 1.0, j  # turn turns the box, which then holds more)
        assert set(np.unique(masks[j])) <= {0, 3}  # nearest: never a new value


@pytest.mark.parametrize(
    "make",
    [lambda: RandomGrayscale(1.01), lambda: RandomGrayscale(float("nan")), lambda: RandomGrayscale(True),
     lambda: GaussianBlur(4), lambda: GaussianBlur(0), lambda: GaussianBlur(-3), lambda: GaussianBlur(10**6),
     lambda: GaussianBlur((3, 4)), lambda: GaussianBlur(3, sigma=0), lambda: GaussianBlur(3, sigma=(2.0, 1.0)),
     lambda: GaussianBlur(3, sigma=float("nan")), lambda: GaussianBlur(3, sigma=-1.0),
     lambda: RandomHSV(h=-0.1), lambda: RandomHSV(s=float("inf")), lambda: RandomHSV(v=2.0),
     lambda: compile_plan([CutMix(), CutMix()])],
)  # fmt: skip
def test_hostile_arguments_are_one_line_errors(make):
    with pytest.raises(ValueError) as info:
        make()
    assert "\n" not in str(info.value)


def test_an_empty_batch_passes_through():
    plan = compile_plan([RandomResizedCrop(32), *EVERY, MixUp()])
    draws = plan.stage.draw(0, 0, np.zeros(0, np.int64), (32, 32), ((0.5,) * 3, (0.2,) * 3))
    assert draws.apply_batch(torch.zeros(0, 3, 32, 32)).shape == (0, 3, 32, 32)
    mix = plan.mix.draw(0, 0, [], (32, 32), detection=False)
    assert not mix.mixes and mix.soft_labels(np.zeros(0, np.int64), 4).shape == (0, 4)


def test_hsv_gains_are_drawn_on_both_sides_of_one_each_within_its_own_bound():
    """Ultralytics draws ``r = uniform(-1, 1, 3) * (h, s, v)`` and scales by ``1 + r``: each gain
    uniform in [1 - g, 1 + g], as often darker as brighter, the three independent of each other."""
    h, s, v = 0.05, 0.6, 0.3
    n = 20_000
    plan = compile_plan([RandomHSV(h=h, s=s, v=v)])
    (part,) = plan.stage.draw(5, 1, np.arange(n), (8, 8)).parts
    r = part.gains
    assert r.shape == (n, 3)
    for k, g in enumerate((h, s, v)):
        assert -g <= r[:, k].min() < -0.98 * g and 0.98 * g < r[:, k].max() <= g, k
        assert abs(r[:, k].mean()) < 0.02 * g and abs((r[:, k] < 0).mean() - 0.5) < 0.02, k
        assert abs((np.abs(r[:, k]) < g / 2).mean() - 0.5) < 0.02, k  # uniform, not bunched
    assert abs(np.corrcoef(r.T)[np.triu_indices(3, 1)]).max() < 0.05  # independent draws
    # the pixels take those gains: a value-only draw makes a colour darker or brighter by 1 + r
    plan = compile_plan([RandomHSV(h=0.0, s=0.0, v=0.5)])
    draws = plan.stage.draw(5, 1, np.arange(64), (4, 4))
    (gains,) = (p.gains[:, 2] for p in draws.parts)
    seen = []
    for j in range(64):
        row = np.empty((3, 4, 4), np.uint8)
        row[:] = np.array([160, 80, 40], np.uint8)[:, None, None]
        draws.apply_row(row, j)
        seen.append(row[0, 0, 0])
    want = np.clip(np.floor(160 * (1 + gains)), 0, 255)
    assert np.abs(np.array(seen, np.float64) - want).max() <= 1
    assert (gains < -0.1).any() and (gains > 0.1).any()
