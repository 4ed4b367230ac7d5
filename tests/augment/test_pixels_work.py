"""The threads' per-sample work on channels-last pixels: a mosaic's canvas rendered as pixels, one warp
of all channels, RandomHSV on the pixels before one split into the row, and channels-last batches
interleaved by OpenCV; each gives the very values of the planes' way, and the YOLO recipe from a
``pixels-hwc`` cache never goes through planes."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import cachekit.augment.mosaic as mosaic_module
import cachekit.augment.samplework as samplework
from cachekit import BuildConfig, build, make_loader
from cachekit.augment import pixelkernels
from cachekit.augment.mosaic import mosaic_layout, render_canvas, render_canvas_pixels
from cachekit.augment.plan import compile_plan
from cachekit.augment.warpmatrix import resize_chw, warp_pixels, warp_planes_to_pixels, warp_sample
from cachekit.feed.devicestage import channels_last
from cachekit.tools.synthetic import synthetic_image
from cachekit.transforms import (
    CenterCrop,
    ColorJitter,
    Letterbox,
    Mosaic,
    RandomAffine,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
)


def _image(seed: int, h: int, w: int) -> np.ndarray:
    return synthetic_image(np.random.default_rng(seed), h, w)


def _hsv_reference(rgb: np.ndarray, gains) -> np.ndarray:
    """Ultralytics' augment_hsv, as written there: OpenCV's HSV, numpy indexing of each table."""
    import cv2

    hue, sat, val = pixelkernels.hsv_tables(np.asarray(gains))
    h, s, v = cv2.split(cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV))
    return cv2.cvtColor(cv2.merge([hue[h], sat[s], val[v]]), cv2.COLOR_HSV2RGB)


@pytest.mark.parametrize("gains", [(0.01, 0.5, -0.3), (-0.5, -0.9, 0.9), (0.3, 0.0, 0.0), (0.0, 1.0, -1.0)])
def test_hsv_on_pixels_is_ultralytics_and_the_row_kernel(gains):
    rgb = _image(1, 37, 53)
    want = _hsv_reference(rgb, gains)
    pixels = rgb.copy()
    pixelkernels.hsv_pixels(pixels, np.array(gains))
    assert np.array_equal(pixels, want)
    row = np.ascontiguousarray(rgb.transpose(2, 0, 1))
    pixelkernels.hsv(row, np.array(gains))
    assert np.array_equal(row, want.transpose(2, 0, 1))
    # a window of a larger image (strided rows): in place, nothing round it touched
    big = _image(2, 60, 80)
    before = big.copy()
    window = big[9:46, 20:73]
    window[...] = rgb
    pixelkernels.hsv_pixels(window, np.array(gains))
    assert np.array_equal(big[9:46, 20:73], want)
    before[9:46, 20:73] = want
    assert np.array_equal(big, before)


def test_hsv_leaves_pixels_that_are_not_rgb():
    for channels in (1, 4):
        pixels = np.random.default_rng(3).integers(0, 256, (9, 11, channels), dtype=np.uint8)
        kept = pixels.copy()
        pixelkernels.hsv_pixels(pixels, np.array([0.4, 0.5, 0.5]))
        assert np.array_equal(pixels, kept)


def test_the_stage_runs_its_leading_pixel_steps_on_pixels_and_the_rest_on_the_row():
    n, hw = 6, (30, 42)
    rgb = [_image(10 + j, *hw) for j in range(n)]
    plan = compile_plan([RandomHSV(), RandomHSV(0.5, 0.9, 0.9), RandomGrayscale(1.0), RandomHSV(0.4, 0.0, 0.0)])
    draws = plan.stage.draw(4, 1, np.arange(n), hw)
    for j in range(n):
        whole = np.ascontiguousarray(rgb[j].transpose(2, 0, 1))
        draws.apply_row(whole, j)
        pixels = rgb[j].copy()
        assert draws.apply_pixels(pixels, j) == 2  # both HSVs, not the grayscale nor what follows it
        row = np.ascontiguousarray(pixels.transpose(2, 0, 1))
        draws.apply_row(row, j, 2)
        assert np.array_equal(row, whole)
    gray_first = compile_plan([RandomGrayscale(1.0), RandomHSV()]).stage.draw(0, 0, np.arange(n), hw)
    pixels = rgb[0].copy()
    assert gray_first.apply_pixels(pixels, 0) == 0 and np.array_equal(pixels, rgb[0])


def _layout(sizes):
    """A mosaic of 48 with one sample of ``sizes[0]`` and three extras: its tiles and regions."""
    step = Mosaic(48)
    hw = np.array([sizes[0]])
    extra_hw = np.array([sizes[1:]])
    tiles, regions, _, _ = mosaic_layout(step, np.array([[0.3, 0.7]]), np.array([[1, 2, 3]]), hw, extra_hw)
    return tiles[0], regions[0]


@pytest.mark.parametrize("origin, shape", [((0, 0), (96, 96)), ((13, 21), (50, 61)), ((60, 30), (36, 36))])
def test_a_canvas_rendered_as_pixels_is_the_planes_canvas(origin, shape):
    # shrunk (longer side 52 and 70 to 48), kept (48 x 30), enlarged (20 x 24 to 40 x 48), none square
    sizes = [(40, 52), (48, 30), (20, 24), (60, 70)]
    tiles, regions = _layout(sizes)
    images = [_image(20 + k, h, w) for k, (h, w) in enumerate(sizes)]
    planes = [np.ascontiguousarray(a.transpose(2, 0, 1)) for a in images]
    want = np.empty((3, *shape), np.uint8)
    render_canvas([torch.from_numpy(p) for p in planes], tiles, regions, 114, resize_chw, want, origin)
    assert (want != 114).any()
    for stored in ("pixels-hwc", "pixels", "mixed"):
        sources = [
            (a, True) if stored == "pixels-hwc" or (stored == "mixed" and k % 2) else (p, False)
            for k, (a, p) in enumerate(zip(images, planes))
        ]
        got = np.full((*shape, 3), 7, np.uint8)
        render_canvas_pixels(sources, tiles, regions, 114, got, origin)
        assert np.array_equal(got.transpose(2, 0, 1), want), stored


def _maps():
    turn = np.array([[np.cos(0.3), -np.sin(0.3), 9.0], [np.sin(0.3), np.cos(0.3), -4.0], [0, 0, 1]])
    return {
        "scale and shift": np.array([[0.8, 0, 5.5], [0, 1.3, -7.25], [0, 0, 1]]),
        "mirror": np.array([[-1.1, 0, 50.0], [0, 0.9, 2.0], [0, 0, 1]]),
        "turn": turn,
        "perspective": np.array([[1.0, 0.1, 2.0], [0.05, 0.9, 1.0], [0.002, 0.001, 1.0]]),
    }


@pytest.mark.parametrize("name", list(_maps()))
@pytest.mark.parametrize("shrink", [None, (20, 28)])
def test_one_warp_of_pixels_is_the_planes_warp(name, shrink):
    matrix = _maps()[name]
    rgb = _image(30, 41, 57)
    planes = np.ascontiguousarray(rgb.transpose(2, 0, 1))
    want = np.empty((3, 36, 44), np.uint8)
    warp_sample(planes, False, matrix, want, 114, shrink)
    got = warp_pixels(rgb, matrix, (36, 44), 114, shrink)
    assert got.shape == (36, 44, 3) and np.array_equal(got.transpose(2, 0, 1), want)
    from_planes = warp_planes_to_pixels(planes, matrix, (36, 44), 114, shrink)  # a canvas of planes
    assert from_planes.shape == (36, 44, 3) and np.array_equal(from_planes.transpose(2, 0, 1), want)
    assert (want == 114).any() and (want != 114).any()  # the map leaves the image somewhere, not all
    # straight into a channels-last row of a batch
    batch = torch.zeros((2, 36, 44, 3), dtype=torch.uint8)
    row = batch[1].numpy()
    assert warp_pixels(rgb, matrix, (36, 44), 114, shrink, into=row) is row
    assert np.array_equal(batch[1].permute(2, 0, 1).numpy(), want) and not batch[0].any()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bfloat16])
def test_channels_last_batches_keep_their_values_and_their_memory(dtype):
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (4, 3, 17, 23), generator=g).to(dtype) for _ in range(3)]
    a = channels_last(batches[0])
    b = channels_last(batches[1])
    for k, got in enumerate((a, b)):
        assert got.dtype == dtype and got.shape == batches[k].shape
        assert got.is_contiguous(memory_format=torch.channels_last) and torch.equal(got, batches[k])
    del got
    if dtype != torch.bfloat16:  # OpenCV's: a batch let go gives its memory to the next one
        pointer = b.data_ptr()
        del b
        gc.collect()
        c = channels_last(batches[2])
        assert c.data_ptr() == pointer and torch.equal(c, batches[2])
    assert torch.equal(a, batches[0])  # the batch still held is never written over
    already = batches[0].contiguous(memory_format=torch.channels_last)
    assert channels_last(already) is already


def _detection_cache(path, store: str):
    def samples():
        for i in range(10):
            rng = np.random.default_rng([5, i])
            h, w = (50, 66) if i % 2 else (62, 44)
            boxes = np.array([[4, 5, 30, 40], [10, 2, 20, 12]], np.float32)
            yield synthetic_image(rng, h, w), {"boxes": boxes, "classes": np.array([0, 1])}

    build(samples(), path, BuildConfig(pipeline="none", store=store, workers=1, progress=False, shard_size=4),
          classes=["a", "b"])  # fmt: skip
    return path


YOLO = [
    Mosaic(48),
    RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5), fill=114),
    RandomHSV(h=0.015, s=0.7, v=0.4),
    RandomHorizontalFlip(),
]


def test_the_yolo_recipe_from_channels_last_pixels_never_goes_through_planes(tmp_path, monkeypatch):
    """From a ``pixels-hwc`` cache each sample is rendered, warped and coloured as pixels and split
    into its row once: no planes canvas, no plane-by-plane warp, no planes HSV, no interleaving of
    planes; the batches are the default store's."""
    planes = _detection_cache(tmp_path / "planes", "pixels")
    pixels = _detection_cache(tmp_path / "hwc", "pixels-hwc")
    want = [b[0] for b in make_loader(planes, 4, seed=2, augment=YOLO, threads=2, collate="yolo")]
    closed = [Letterbox(48), *YOLO[1:]]  # mosaic closed (Ultralytics' close_mosaic)
    want_closed = [b[0] for b in make_loader(planes, 4, seed=2, augment=closed, threads=2, collate="yolo")]

    def refused(*args, **kwargs):
        raise AssertionError("a planes route was taken")

    splits = []
    split = samplework.hwc_into_planes
    monkeypatch.setattr(samplework, "hwc_into_planes", lambda src, out: (splits.append(src.shape), split(src, out)))
    for module, name in ((samplework, "render_canvas"), (samplework, "warp_sample"), (samplework, "warp_planes_to_pixels"),
                         (mosaic_module, "planes_as_pixels"), (mosaic_module, "planes_into_hwc"),
                         (pixelkernels, "hsv")):  # fmt: skip
        monkeypatch.setattr(module, name, refused)
    got = [b[0] for b in make_loader(pixels, 4, seed=2, augment=YOLO, threads=2, collate="yolo")]
    assert len(splits) == 10 and set(splits) == {(48, 48, 3)}  # one split a sample, of its finished pixels
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    last = [b[0] for b in make_loader(pixels, 4, seed=2, augment=YOLO, threads=2, collate="yolo", channels_last=True)]
    assert all(x.is_contiguous(memory_format=torch.channels_last) and torch.equal(x, y) for x, y in zip(last, want))
    splits.clear()  # the letterboxed sample too: warped and coloured as pixels, split once
    got = [b[0] for b in make_loader(pixels, 4, seed=2, augment=closed, threads=2, collate="yolo")]
    assert len(splits) == 10 and all(torch.equal(a, b) for a, b in zip(got, want_closed))


def test_colour_jitter_before_hsv_runs_on_the_planes_first(tmp_path):
    """ColorJitter works on planes: a mosaic with it is warped, jittered, then coloured by RandomHSV,
    on the threads as on the device path (within their usual rounding)."""
    pixels = _detection_cache(tmp_path / "hwc", "pixels-hwc")
    steps = [Mosaic(48), ColorJitter(0.5, 0.5, 0.5, 0.05), RandomHSV()]
    threads = torch.cat([b[0] for b in make_loader(pixels, 5, seed=4, augment=steps, threads=2, collate="yolo")])
    device = torch.cat([b[0] for b in make_loader(pixels, 5, seed=4, augment=steps, collate="yolo", device="cpu",
                                                  augment_on="device")])  # fmt: skip
    diff = (threads.float() - device.float()).abs()
    # the two paths' ColorJitter rounds apart by 0.7 levels on average here (so before the pixels work
    # too); a jitter left out would differ by tens of levels
    assert diff.mean() < 1.2 and (diff > 8).float().mean() < 0.01, (diff.mean(), (diff > 8).float().mean())


def _crop_cache(path, store: str):
    def samples():
        for i in range(6):
            yield synthetic_image(np.random.default_rng([6, i]), 40, 52), i % 2

    build(samples(), path, BuildConfig(pipeline="none", store=store, workers=1, progress=False, shard_size=4),
          classes=["a", "b"])  # fmt: skip
    return path


def test_a_crop_at_its_own_size_is_interleaved_or_split_by_opencv_into_any_layout(tmp_path, monkeypatch):
    """CenterCrop at the output's size copies the crop into the row: planes into a channels-last
    batch are interleaved (``cv2.merge``) and stored pixels into planes are split (``cv2.split``),
    never copied element by element by numpy; every store and memory format gives the same batch."""
    import cachekit.augment.warp as warp_module

    calls = []
    for name in ("planes_into_hwc", "hwc_into_planes"):
        real = getattr(warp_module, name)
        monkeypatch.setattr(warp_module, name, lambda a, out, real=real, name=name: (calls.append(name), real(a, out)))
    caches = {store: _crop_cache(tmp_path / store, store) for store in ("pixels", "pixels-hwc")}
    want = torch.cat([b[0] for b in make_loader(caches["pixels"], 4, seed=1, augment=[CenterCrop((32, 40))])])
    assert calls == []  # planes into planes: a plain copy
    for store, last, kernel in (("pixels", True, "planes_into_hwc"), ("pixels-hwc", False, "hwc_into_planes"),
                                ("pixels-hwc", True, None)):  # fmt: skip
        calls.clear()
        loader = make_loader(caches[store], 4, seed=1, augment=[CenterCrop((32, 40))], channels_last=last)
        got = [b[0] for b in loader]
        assert all(x.is_contiguous(memory_format=torch.channels_last) == last for x in got)
        assert torch.equal(torch.cat(got), want), (store, last)
        assert calls == ([kernel] * 6 if kernel else []), (store, last)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_a_window_of_pixels_splits_into_planes_at_any_alignment(dtype):
    """A crop of pixels (strided rows) is split as it is into planes on 32-byte boundaries and copied
    whole first into any others (``cv2.split`` crawls from such a window into planes off 32-byte
    alignment); the planes are the crop's whatever their alignment and size (30 x 40 planes are off
    the boundary after the first, 32 x 32 ones on it), and a second window does not see the first's."""
    from cachekit.image import ops
    from cachekit.image.ops import hwc_into_planes

    rng = np.random.default_rng(8)
    pixels = rng.integers(0, 256, (50, 70, 3)).astype(dtype)
    raw = np.zeros(3 * 32 * 40 * 4 + 256, np.uint8)
    base = (-raw.ctypes.data) % 64
    for h, w in ((30, 40), (32, 32)):
        for offset in (0, 4, 16, 32, 48):
            start = base + offset
            out = raw[start : start + 3 * h * w * np.dtype(dtype).itemsize].view(dtype).reshape(3, h, w)
            aligned = offset % 32 == 0 and (h * w * np.dtype(dtype).itemsize) % 32 == 0
            assert ops._aligned_planes(out) == aligned, (h, w, offset)
            for top, left in ((3, 5), (17, 30)):
                window = pixels[top : top + h, left : left + w]
                hwc_into_planes(window, out)
                assert np.array_equal(out, window.transpose(2, 0, 1)), (h, w, offset, top)
    assert not ops._aligned_planes(np.zeros((2, 3, 32, 32), np.uint8)[:, 0])  # planes apart, not one block
