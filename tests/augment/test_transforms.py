"""Batched augmentation: draws from (seed, epoch, index), OpenCV and grid_sample paths against references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cachekit.augment.colour import jitter_batch, jitter_planes
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import (
    CenterCrop,
    ColorJitter,
    Letterbox,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)
from cachekit.augment.warp import warp_batch, warp_hwc, warp_planes
from cachekit.tools.synthetic import synthetic_image


def _images(n: int, seed: int = 0, sizes=None) -> list[np.ndarray]:
    """Photo-like channels-first images of varied sizes."""
    rng = np.random.default_rng(seed)
    sizes = sizes or [(96 + 7 * (i % 5), 128 + 11 * (i % 3)) for i in range(n)]
    return [np.ascontiguousarray(synthetic_image(rng, h, w).transpose(2, 0, 1)) for h, w in sizes[:n]]


def _sizes(images) -> tuple[np.ndarray, np.ndarray]:
    return np.array([im.shape[1] for im in images]), np.array([im.shape[2] for im in images])


def _cpu(images, draws) -> np.ndarray:
    h, w = _sizes(images)
    inside = draws.inside(h, w)
    out = np.zeros((len(images), 3, *draws.out_size), np.uint8)
    for j, img in enumerate(images):
        pre = draws.pre[j] if draws.pre is not None else None
        warp_planes(img, draws.boxes[j], bool(draws.flips[j]), bool(inside[j]), out[j], draws.fill, pre)
        if draws.jitter is not None:
            jitter_planes(out[j], draws.jitter[j], draws.order[j])
    return out


def _device(images, draws) -> torch.Tensor:
    h, w = _sizes(images)
    canvas = torch.zeros(len(images), 3, int(h.max()), int(w.max()), dtype=torch.uint8)
    for j, img in enumerate(images):
        canvas[j, :, : h[j], : w[j]] = torch.from_numpy(img)
    x = warp_batch(
        canvas,
        torch.from_numpy(draws.boxes),
        torch.from_numpy(draws.flips),
        torch.from_numpy(np.stack([h, w], axis=1)),
        draws.out_size,
        draws.fill,
        torch.from_numpy(draws.pre) if draws.pre is not None else None,
    )
    if draws.jitter is None:
        return x
    return jitter_batch(x, torch.from_numpy(draws.jitter), order=torch.from_numpy(draws.order))


def test_draws_depend_on_seed_epoch_and_index_only():
    plan = compile_plan([RandomResizedCrop(32), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1)])
    idx = np.array([5, 9, 1000, 7])
    a = plan.draw(3, 1, idx, [100] * 4, [120] * 4)
    alone = plan.draw(3, 1, idx[1:2], [100], [120])  # another batch, another thread count: same draws
    assert (a.boxes[1] == alone.boxes[0]).all() and a.flips[1] == alone.flips[0]
    assert np.array_equal(a.jitter[1], alone.jitter[0])
    again = plan.draw(3, 1, idx, [100] * 4, [120] * 4)
    assert np.array_equal(a.boxes, again.boxes) and np.array_equal(a.jitter, again.jitter)
    other_epoch = plan.draw(3, 2, idx, [100] * 4, [120] * 4)
    other_seed = plan.draw(4, 1, idx, [100] * 4, [120] * 4)
    assert not np.array_equal(a.boxes, other_epoch.boxes) and not np.array_equal(a.boxes, other_seed.boxes)


def test_random_resized_crop_boxes_respect_scale_and_ratio():
    step = RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    n = 4000
    draws = compile_plan([step]).draw(0, 0, np.arange(n), np.full(n, 256), np.full(n, 341))
    top, left, h, w = draws.boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 256).all() and (left + w <= 341).all()
    area = h * w / (256 * 341)
    assert area.min() >= 0.08 * 0.97 and area.max() <= 1.0
    ratio = w / h
    assert ratio.min() >= 0.75 * 0.97 and ratio.max() <= 4 / 3 * 1.03  # rounding to whole pixels
    assert area.max() > 0.9 and area.min() < 0.1  # the whole range is used
    small = compile_plan([RandomResizedCrop(8, scale=(0.05, 0.3))]).draw(
        1, 0, np.arange(n), np.full(n, 300), np.full(n, 300)
    )
    logs = np.log(small.boxes[:, 3] / small.boxes[:, 2])  # every attempt fits: log-uniform aspect
    assert abs(logs.mean()) < 0.02 and abs(logs.std() - math.log(4 / 3) * 2 / math.sqrt(12)) < 0.02
    tall = compile_plan([step]).draw(0, 0, np.arange(50), np.full(50, 1000), np.full(50, 10))
    t, lft, th, tw = tall.boxes.T  # no attempt fits: torchvision's central fallback crop
    assert (tw == 10).all() and (th == round(10 / 0.75)).all() and (t == (1000 - th) // 2).all()


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_flip_rate_is_near_p(p):
    n = 4000
    draws = compile_plan([RandomHorizontalFlip(p)]).draw(7, 3, np.arange(n), np.full(n, 8), np.full(n, 8))
    assert abs(draws.flips.mean() - p) < 4 * math.sqrt(p * (1 - p) / n)


def _pil_resize(hwc: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """PIL's bilinear resize: the antialiased filter torchvision v2 (and torchvision on PIL images) uses."""
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(hwc)).resize(hw[::-1], Image.BILINEAR))


def test_cpu_path_equals_an_independent_antialiased_crop_resize_flip():
    images = _images(6)
    plan = compile_plan([RandomResizedCrop(40), RandomHorizontalFlip()])
    draws = plan.draw(1, 0, np.arange(6), *_sizes(images))
    out = _cpu(images, draws)
    assert draws.flips.any() and not draws.flips.all()
    for j, img in enumerate(images):
        t, left, h, w = draws.boxes[j]
        ref = _pil_resize(img.transpose(1, 2, 0)[t : t + h, left : left + w], (40, 40))
        ref = ref[:, ::-1] if draws.flips[j] else ref
        assert np.abs(out[j].transpose(1, 2, 0).astype(int) - ref).max() <= 1
        decoded = np.zeros_like(out[j])  # the channels-last path (decoded JPEGs) agrees exactly
        warp_hwc(
            np.ascontiguousarray(img.transpose(1, 2, 0)), draws.boxes[j], bool(draws.flips[j]), True, decoded
        )
        assert np.array_equal(decoded, out[j])


@pytest.mark.parametrize(
    "steps",
    [
        [RandomResizedCrop(48), RandomHorizontalFlip()],
        [Resize(80), CenterCrop(64)],
        [CenterCrop(200)],  # larger than the images: zero padding
        [Letterbox(72), RandomHorizontalFlip()],  # shrunk, padded with 114
        [RandomResizedCrop(32, scale=(0.5, 1.0)), ColorJitter(0.4, 0.4, 0.4, 0.1)],
    ],
)
def test_device_path_matches_the_opencv_path(steps):
    images = _images(8, seed=3)
    draws = compile_plan(steps).draw(5, 2, np.arange(100, 108), *_sizes(images))
    cpu = torch.from_numpy(_cpu(images, draws)).float()
    dev = _device(images, draws)
    diff = (dev - cpu).abs()
    if draws.jitter is None:  # torch's fixed-point antialiased resize vs float weights (and the
        assert diff.max() <= (1.5 if draws.pre is not None else 1.0)  # CPU's 8 bits between two resizes)
    else:  # 8-bit rounding per step, and OpenCV's 8-bit HSV for hue
        assert diff.mean() < 1.0 and diff.max() <= 12


def test_eval_center_crop_of_a_short_side_cache_is_exact():
    images = _images(4, sizes=[(256, 300), (256, 256), (341, 256), (256, 400)])
    draws = compile_plan([Resize(256), CenterCrop(224)]).draw(0, 0, np.arange(4), *_sizes(images))
    out = _cpu(images, draws)
    for j, img in enumerate(images):
        _, h, w = img.shape
        top, left = int(round((h - 224) / 2)), int(round((w - 224) / 2))
        assert np.array_equal(out[j], img[:, top : top + 224, left : left + 224])


def test_center_crop_larger_than_the_image_pads_with_zeros():
    images = _images(2, sizes=[(30, 40), (40, 30)])
    draws = compile_plan([CenterCrop(48)]).draw(0, 0, np.arange(2), *_sizes(images))
    out = _cpu(images, draws)
    for j, img in enumerate(images):
        _, h, w = img.shape
        ref = np.zeros((3, 48, 48), np.uint8)
        top, left = int(round((48 - h) / 2)), int(round((48 - w) / 2))
        ref[:, top : top + h, left : left + w] = img
        assert np.array_equal(out[j], ref)


def test_colour_jitter_follows_torchvision_definitions():
    img = _images(1, sizes=[(32, 32)])[0]
    x = torch.from_numpy(img).float()[None]
    factors = torch.tensor([[1.3, 1.0, 1.0, 0.0]])
    assert torch.equal(jitter_batch(x, factors, hue=False), (x * 1.3).clamp(0, 255))
    gray = (0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2])[:, None]
    sat = jitter_batch(x, torch.tensor([[1.0, 1.0, 0.0, 0.0]]), hue=False)
    torch.testing.assert_close(sat, gray.expand_as(x))  # saturation 0: the gray image
    con = jitter_batch(x, torch.tensor([[1.0, 0.0, 1.0, 0.0]]), hue=False)
    torch.testing.assert_close(con, gray.mean().expand_as(x))  # contrast 0: the mean gray level
    full_turn = jitter_batch(x, torch.tensor([[1.0, 1.0, 1.0, 0.5]]))
    twice = jitter_batch(full_turn, torch.tensor([[1.0, 1.0, 1.0, 0.5]]))
    torch.testing.assert_close(twice, x, atol=1e-3, rtol=0)  # two half turns: back where it began


def test_plans_refuse_what_they_cannot_do():
    with pytest.raises(TypeError, match="cachekit.transforms"):
        compile_plan([object()])
    with pytest.raises(TypeError, match=r"wrap it as PixelOp\(fn\)"):
        compile_plan([lambda x: x])
    with pytest.raises(ValueError, match="at most one ColorJitter"):
        compile_plan([ColorJitter(0.1), ColorJitter(0.2)])
    with pytest.raises(ValueError, match="scale"):
        RandomResizedCrop(224, scale=(0.9, 0.1))
    with pytest.raises(ValueError, match="different sizes"):
        compile_plan([Resize(64)]).draw(0, 0, np.arange(2), [100, 120], [100, 100])
    assert compile_plan([Resize(64)]).draw(0, 0, np.arange(2), [100, 100], [120, 120]).out_size == (64, 76)


def test_colour_jitter_takes_torchvision_forms_and_refuses_non_finite_strengths():
    for bad in (float("nan"), float("inf"), -0.1, (1.5, 0.5), (-0.1, 1.0), "0.4", True):
        with pytest.raises(ValueError, match="ColorJitter"):
            ColorJitter(brightness=bad)
    for bad in (0.6, -0.1, (-0.6, 0.1), float("nan")):
        with pytest.raises(ValueError, match="hue"):
            ColorJitter(hue=bad)
    with pytest.raises(ValueError, match="p must be"):
        RandomHorizontalFlip("x")
    plan = compile_plan([ColorJitter(brightness=(0.5, 0.6), contrast=0.2, hue=(-0.05, 0.0))])
    jitter = plan.draw(3, 1, np.arange(500), [32] * 500, [32] * 500).jitter
    assert (jitter[:, 0] >= 0.5).all() and (jitter[:, 0] <= 0.6).all()
    assert (jitter[:, 1] >= 0.8).all() and (jitter[:, 1] <= 1.2).all() and jitter[:, 1].std() > 0.05
    assert (jitter[:, 2] == 1.0).all()
    assert (jitter[:, 3] >= -0.05).all() and (jitter[:, 3] <= 0.0).all()
    assert RandomResizedCrop(np.int64(16)).size == 16  # numpy integers are sizes too


def test_random_resized_crop_positions_reach_every_edge():
    """Every position of the box is drawn, the last row and column included (torchvision's
    ``randint(0, H - h + 1)``): a range one short would never crop the bottom or right edge."""
    n = 3000
    step = RandomResizedCrop(8, scale=(0.25, 0.25), ratio=(1.0, 1.0))  # always a 16x16 box of 32x32
    top, left, h, w = compile_plan([step]).draw(0, 0, np.arange(n), np.full(n, 32), np.full(n, 32)).boxes.T
    assert (h == 16).all() and (w == 16).all()
    assert set(top.tolist()) == set(range(17)) and set(left.tolist()) == set(range(17))


@pytest.mark.parametrize(
    "steps, reference",
    [
        ([Resize(64), CenterCrop(56)], "resize+crop"),
        ([RandomResizedCrop(48, scale=(0.3, 0.6))], "crop"),  # shrinks 1.5-3x
    ],
)
def test_shrinking_is_within_one_level_of_torchvisions_antialiased_resize(steps, reference):
    """torchvision v2 antialiases when it shrinks (PIL's filter): plain bilinear differed by ~2 levels."""
    images = _images(8, seed=9, sizes=[(150, 200)] * 8)
    draws = compile_plan(steps).draw(0, 0, np.arange(8), *_sizes(images))
    out = _cpu(images, draws)
    diffs = []
    for j, img in enumerate(images):
        hwc = img.transpose(1, 2, 0)
        if reference == "resize+crop":  # torchvision: Resize(64) of 150x200 is 64x85, then the centre
            small = _pil_resize(hwc, (64, 85))
            ref = small[4:60, 14:70]
        else:
            t, left, h, w = draws.boxes[j]
            ref = _pil_resize(hwc[t : t + h, left : left + w], draws.out_size)
        diffs.append(np.abs(out[j].transpose(1, 2, 0).astype(int) - ref).mean())
    assert max(diffs) <= 1.0, diffs


def test_colour_jitter_order_is_drawn_per_sample_and_followed():
    plan = compile_plan([ColorJitter(0.4, 0.4, 0.4, 0.1)])
    draws = plan.draw(0, 0, np.arange(2000), [8] * 2000, [8] * 2000)
    orders = {tuple(o) for o in draws.order.tolist()}
    assert len(orders) == 24  # every permutation of the four occurs
    img = _images(1, sizes=[(24, 24)])[0]
    factors = np.array([1.4, 0.6, 1.3, 0.0], np.float32)
    one, other = img.copy(), img.copy()
    jitter_planes(one, factors, (0, 1, 2, 3))
    jitter_planes(other, factors, (1, 0, 2, 3))  # contrast before brightness: another image
    assert np.abs(one.astype(int) - other.astype(int)).max() > 3
    x = torch.from_numpy(np.stack([img, img])).float()
    both = jitter_batch(x, torch.from_numpy(np.stack([factors, factors])), hue=False,
                        order=torch.tensor([[0, 1, 2, 3], [1, 0, 2, 3]]))  # fmt: skip
    assert (both[0] - torch.from_numpy(one).float()).abs().max() <= 2
    assert (both[1] - torch.from_numpy(other).float()).abs().max() <= 2


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomResizedCrop(10**6),
        lambda: RandomResizedCrop((224, 8193)),
        lambda: CenterCrop(10**9),
        lambda: Resize((100000, 10)),
    ],
)
def test_transform_sizes_past_the_limit_are_refused_when_made(make):
    with pytest.raises(ValueError, match="largest side an image may have, 8192 pixels"):
        make()


def test_colour_jitter_refuses_factors_that_overflow_the_draws():
    # 1e300 became inf in the float32 draws (a RuntimeWarning and NaN-prone products); 1000 is all white already
    for bad in (1e300, (0.5, 1e12), 2**63):
        with pytest.raises(ValueError, match="within"):
            ColorJitter(brightness=bad)
        with pytest.raises(ValueError, match="within"):
            ColorJitter(contrast=bad)
    jitter = compile_plan([ColorJitter(brightness=999.0)]).draw(0, 0, np.arange(8), [8] * 8, [8] * 8).jitter
    assert np.isfinite(jitter).all()
