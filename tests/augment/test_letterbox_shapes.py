"""Letterbox to a (height, width) canvas, as Ultralytics' ``LetterBox(new_shape=(h, w))``: the image
scaled by the largest factor that fits it in, centred, the rest ``fill``; boxes moved alike; a square
size given as an int or a pair gives the same bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cachekit import BuildConfig, build, make_loader
from cachekit.transforms import Letterbox, RandomHorizontalFlip

SHAPES = [(50, 70), (90, 40), (64, 100), (33, 33)]


@pytest.fixture(scope="module")
def boxes_cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("letterbox") / "cache"

    def samples():
        rng = np.random.default_rng(5)
        for h, w in SHAPES:
            image = rng.integers(0, 100, (h, w, 3), dtype=np.uint8)  # never the fill, 114
            box = np.array([[w * 0.25, h * 0.2, w * 0.75, h * 0.9]], np.float32)
            yield image, {"boxes": box, "classes": np.array([0])}

    build(samples(), out, BuildConfig(pipeline="max-side-512", progress=False), classes=["thing"])
    return str(out)


def _read(cache, steps, augment_on):
    device = "cpu" if augment_on == "device" else None
    loader = make_loader(cache, len(SHAPES), augment=steps, threads=1, shuffle=False, augment_on=augment_on,
                         device=device)  # fmt: skip
    images, targets = next(iter(loader))
    return images, targets


@pytest.mark.parametrize("augment_on", ["threads", "device"])
def test_a_letterbox_to_height_and_width_fits_each_image_and_fills_the_rest(boxes_cache, augment_on):
    out_h, out_w = 64, 100
    images, targets = _read(boxes_cache, [Letterbox((out_h, out_w))], augment_on)
    assert images.shape == (len(SHAPES), 3, out_h, out_w) and images.dtype == torch.uint8
    for j, (h, w) in enumerate(SHAPES):
        r = min(out_h / h, out_w / w)
        nh, nw = round(h * r), round(w * r)
        top, left = (out_h - nh) // 2, (out_w - nw) // 2
        inside = np.zeros((out_h, out_w), bool)
        inside[top : top + nh, left : left + nw] = True
        img = images[j].numpy()
        assert (img[:, ~inside] == 114).all(), (h, w)  # the margins are the fill ...
        assert (img[:, inside] < 114).all(), (h, w)  # ... and only the margins
        assert (nh == out_h) or (nw == out_w), (h, w)  # one side fills the canvas
        expected = np.array([w * 0.25, h * 0.2, w * 0.75, h * 0.9]) * [nw / w, nh / h, nw / w, nh / h]
        expected += [left, top, left, top]
        got = targets[j]["boxes"].numpy().reshape(-1)
        assert np.abs(got - expected).max() <= 1.0, (h, w, got, expected)


def test_the_threads_and_the_device_give_the_same_letterbox(boxes_cache):
    steps = [Letterbox((48, 80)), RandomHorizontalFlip()]
    a, ta = _read(boxes_cache, steps, "threads")
    b, tb = _read(boxes_cache, steps, "device")
    # the same margins; inside, an enlarging resize on the threads is OpenCV's bilinear, on the
    # device torch's: a level apart at most
    assert torch.equal(a == 114, b == 114)
    assert (a.int() - b.int()).abs().max() <= 1
    for x, y in zip(ta, tb):
        assert torch.allclose(x["boxes"], y["boxes"], atol=1e-3)


def test_a_square_letterbox_is_the_same_as_an_int_or_a_pair(boxes_cache):
    a, ta = _read(boxes_cache, [Letterbox(72)], "threads")
    b, tb = _read(boxes_cache, [Letterbox((72, 72))], "threads")
    assert a.shape[-2:] == (72, 72) and torch.equal(a, b)
    assert all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(ta, tb))


@pytest.mark.parametrize("size", [(0, 10), (10,), "64", (64, 100.5), -3])
def test_a_size_that_is_no_canvas_is_refused_in_one_line(size):
    with pytest.raises(ValueError, match="Letterbox: size must be a positive int or") as info:
        Letterbox(size)
    assert "\n" not in str(info.value)
