"""The per-sample recipes the benchmarks compare against (``benchmarks/recipe_baselines.py``) compute
what cachekit's own kernels compute: each RandAugment op at torchvision's magnitudes, the HSV tables,
MixUp and CutMix, the antialiased crop; and the DataLoader baselines give the batches a trainer takes."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import cachekit.transforms as T
from cachekit import BuildConfig, CachedDataset, build
from cachekit.augment import pixelkernels
from cachekit.augment.autoaugment import OpDraws, space_of
from cachekit.augment.mixing import MixDraws
from cachekit.augment.warp import _resize_array
from cachekit.tools.synthetic import make_synthetic_folder, synthetic_image
from cachekit.tools.synthetic_objects import make_object_dataset

ROOT = Path(__file__).resolve().parents[2]


def _load():
    path = ROOT / "benchmarks" / "recipe_baselines.py"
    spec = importlib.util.spec_from_file_location("cachekit_recipe_baselines", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


rb = _load()
OPS = [name for name in rb.RAND_OPS if name != "Identity"]


def _image(h: int = 48, w: int = 64, seed: int = 0) -> np.ndarray:
    """Photo-like pixels with every level 0-255 somewhere (so every table entry is used)."""
    img = synthetic_image(np.random.default_rng(seed), h, w)
    img.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)
    return img


def _cachekit_op(hwc: np.ndarray, name: str, magnitude: float) -> np.ndarray:
    """cachekit's own kernel of one op on the planes, back as pixels."""
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    draws = OpDraws(
        names=(name,), ops=np.zeros((1, 1), np.int64), magnitudes=np.array([[magnitude]], np.float32),
        fill=(0,), out_hw=chw.shape[1:],
    )  # fmt: skip
    draws.apply_row(chw, 0)
    return chw.transpose(1, 2, 0)


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("bin_", [0, 9, 30])
@pytest.mark.parametrize("negative", [False, True])
def test_each_randaugment_op_is_cachekits(name, bin_, negative):
    h, w = 48, 64  # not square: a width where a height belongs shows
    table, signed = space_of(T.RandAugment())[name]
    expected_magnitude = table(31, h, w)
    expected_magnitude = 0.0 if expected_magnitude is None else float(expected_magnitude[bin_])
    if signed and negative:
        expected_magnitude = -expected_magnitude
    magnitude = rb.rand_magnitude(name, bin_, h, w, negative)
    assert magnitude == expected_magnitude
    img = _image(h, w)
    ours = rb.apply_op(img.copy(), name, magnitude)
    theirs = _cachekit_op(img, name, magnitude)
    assert ours.shape == img.shape and ours.dtype == np.uint8
    diff = np.abs(ours.astype(int) - theirs.astype(int))
    if name == "Color":  # OpenCV's fixed-point gray against cachekit's float gray: one level at most
        assert diff.max() <= 1 and (diff == 0).mean() > 0.9
    else:
        assert diff.max() == 0, f"{name} {magnitude}: {int((diff > 0).sum())} values differ"


def test_ops_change_pixels_where_cachekits_do():
    """Not a vacuous comparison: at bin 9 every op but Identity changes the image."""
    img = _image()
    for name in OPS:
        assert not np.array_equal(
            rb.apply_op(img.copy(), name, rb.rand_magnitude(name, 9, 48, 64, False)), img
        )


def test_hsv_is_ultralytics_tables_as_cachekit_runs_them():
    img = _image(64, 80, seed=3)
    for gains in ([0.01, -0.5, 0.3], [-0.015, 0.7, -0.4]):
        ours = rb.hsv(img.copy(), gains)
        chw = np.ascontiguousarray(img.transpose(2, 0, 1))
        pixelkernels.hsv(chw, np.array(gains))
        assert np.array_equal(ours, chw.transpose(1, 2, 0))
        assert not np.array_equal(ours, img)


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mix_batch_is_cachekits(kind):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (4, 3, 20, 24), dtype=np.uint8)
    box = (3, 15, 5, 11)
    lam = rb.mix_batch(ours := images.copy(), kind, 0.37, box)
    draws = MixDraws(kind=kind, lam=0.37, box=box)
    theirs = np.empty_like(images)
    for j in range(len(images)):
        draws.mix_row(images, theirs, j)
    assert np.array_equal(ours, theirs)
    expected = 0.37 if kind == "mixup" else 1 - 12 * 6 / (20 * 24)
    assert lam == pytest.approx(expected)
    # sample 0 takes from the last one (a roll by one)
    assert np.array_equal(ours[0, :, 3:15, 5:11], images[3, :, 3:15, 5:11]) == (kind == "cutmix")


@pytest.mark.parametrize("box", [(10, 20, 200, 150), (30, 40, 100, 120)])
def test_antialiased_crop_is_cachekits_resize(box):
    """The floor's crop: shrinking (torch's antialiased kernel) and enlarging (bilinear)."""
    chw = np.ascontiguousarray(synthetic_image(np.random.default_rng(5), 256, 300).transpose(2, 0, 1))
    out = np.empty((3, 112, 112), np.uint8)
    rb.into_planes(rb.crop_resize(chw, box, (112, 112), rb.resize_antialiased), out)
    top, left, h, w = box
    theirs = np.empty_like(out)
    _resize_array(chw[:, top : top + h, left : left + w], theirs)
    assert np.array_equal(out, theirs)


def test_deit_sample_flips_erases_and_comes_back_as_planes():
    chw = np.ascontiguousarray(synthetic_image(np.random.default_rng(7), 64, 80).transpose(2, 0, 1))
    box = (4, 6, 50, 60)
    plain, flipped = np.empty((3, 32, 32), np.uint8), np.empty((3, 32, 32), np.uint8)
    rb.deit_sample(chw, box, False, [], None, plain)
    rb.deit_sample(chw, box, True, [], (2, 3, 5, 7), flipped)
    crop = np.ascontiguousarray(chw[:, 4:54, 6:66].transpose(1, 2, 0))
    assert np.array_equal(plain, cv2.resize(crop, (32, 32), interpolation=cv2.INTER_AREA).transpose(2, 0, 1))
    expected = plain[:, :, ::-1].copy()
    expected[:, 2:7, 3:10] = 0
    assert np.array_equal(flipped, expected)


def test_yolo_flip_folded_into_the_warp_is_a_flip():
    rng = np.random.default_rng(2)
    tiles = [np.ascontiguousarray(synthetic_image(rng, 48, 64).transpose(2, 0, 1)) for _ in range(4)]
    canvas, placed = rb.mosaic_canvas(tiles, 70, 50, 64)
    assert canvas.shape == (128, 128, 3) and canvas[0, 0].tolist() == [114] * 3  # fill 114
    # Ultralytics' quadrants round (70, 50): top-left, top-right, bottom-left, bottom-right, cut at the edge
    assert np.array_equal(canvas[50 - 48 : 50, 70 - 64 : 70], tiles[0].transpose(1, 2, 0))
    assert np.array_equal(canvas[2:50, 70:128], tiles[1][:, :, :58].transpose(1, 2, 0))
    assert np.array_equal(canvas[50:98, 6:70], tiles[2].transpose(1, 2, 0))
    assert np.array_equal(canvas[50:98, 70:128], tiles[3][:, :, :58].transpose(1, 2, 0))
    assert (canvas[98:, :] == 114).all() and (canvas[:, :6] == 114).all()
    assert placed[0] == (1.0, 6, 2)
    matrix = rb.yolo_matrix(64, 0.8, 0.45, 0.55)
    plain, flipped = np.empty((3, 64, 64), np.uint8), np.empty((3, 64, 64), np.uint8)
    rb.yolo_pixels(canvas, matrix, [0.0, 0.0, 0.0], False, 64, plain)
    rb.yolo_pixels(canvas, matrix, [0.0, 0.0, 0.0], True, 64, flipped)
    diff = np.abs(flipped.astype(int) - plain[:, :, ::-1].astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    # the warp is Ultralytics' (bilinear, border 114), then cachekit's HSV kernel
    warped = cv2.warpAffine(canvas, matrix, (64, 64), borderValue=(114, 114, 114))
    chw = np.ascontiguousarray(warped.transpose(2, 0, 1))
    pixelkernels.hsv(chw, np.zeros(3))
    assert np.array_equal(chw, plain)


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipes")
    make_synthetic_folder(root / "raw", 8, classes=2, size=(120, 150))
    build(root / "raw", root / "cls", BuildConfig(pipeline="train-256", progress=False))
    make_object_dataset(root / "objects", 6, size=(96, 128), most=4, ext=".jpg")
    build(root / "objects", root / "det", BuildConfig(annotations="yolo", pipeline="max-side-512", size=128,
                                                      progress=False))  # fmt: skip
    return root / "cls", root / "det"


def test_deit_loader_gives_mixed_uint8_batches(caches):
    random.seed(0)
    ds = CachedDataset(caches[0], transform=rb.DeitPerSample(64))
    images, labels = next(iter(DataLoader(ds, 4, collate_fn=rb.MixCollate(2))))
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.uint8
    assert labels.shape == (4, 2) and torch.allclose(labels.sum(1), torch.ones(4))


def test_yolo_loader_gives_canvases_and_boxes_inside(caches):
    random.seed(0)
    ds = rb.YoloPerSample(caches[1], 128)
    images, targets = next(iter(DataLoader(ds, 3, collate_fn=rb.yolo_collate)))
    assert images.shape == (3, 3, 128, 128) and images.dtype == torch.uint8
    assert (images == 114).any()  # the border and the canvas are Ultralytics' grey
    for t in targets:
        boxes = t["boxes"]
        assert boxes.dtype == torch.float32 and len(boxes) == len(t["classes"])
        assert ((boxes >= 0) & (boxes <= 128)).all() and (boxes[:, 2:] > boxes[:, :2]).all()


@pytest.mark.parametrize("seed", range(6))
def test_yolo_floor_renders_only_the_window_the_warp_reads(seed):
    """The floor's canvas window holds the full canvas's pixels, and warping it gives the full warp."""
    rng, draw = np.random.default_rng(seed), random.Random(seed)
    s = 64
    sizes = [(48, 64), (40, 56), (64, 50), (30, 44)]  # tiles at the longer side 64, and smaller ones resized
    tiles = [np.ascontiguousarray(synthetic_image(rng, h, w).transpose(2, 0, 1)) for h, w in sizes]
    xc, yc = int(draw.uniform(s // 2, 3 * s // 2)), int(draw.uniform(s // 2, 3 * s // 2))
    matrix = rb.yolo_matrix(s, draw.uniform(0.5, 1.5), draw.uniform(0.4, 0.6), draw.uniform(0.4, 0.6))
    full, _ = rb.mosaic_canvas(tiles, xc, yc, s)
    x0, y0, x1, y1 = window = rb.canvas_window(matrix, s, 2 * s)
    part = rb.window_canvas(tiles, xc, yc, s, window)
    assert np.array_equal(part, full[y0:y1, x0:x1])
    assert (x1 - x0) * (y1 - y0) < (2 * s) ** 2 or matrix[0, 0] < 0.55  # a window, not the canvas
    shifted = matrix @ np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1]], float)
    a, b = np.empty((3, s, s), np.uint8), np.empty((3, s, s), np.uint8)
    rb.yolo_pixels(full, matrix, [0.01, 0.3, -0.2], seed % 2 == 0, s, a)
    rb.yolo_pixels(part, shifted, [0.01, 0.3, -0.2], seed % 2 == 0, s, b)
    diff = np.abs(a.astype(int) - b.astype(int))
    assert diff.max() <= 2 and (diff == 0).mean() > 0.99


def test_draws_are_the_recipes():
    draw = random.Random(0)
    chains = [rb.draw_ops(2, 9, 224, 224, draw) for _ in range(2000)]
    names = [name for chain in chains for name, _ in chain]
    assert all(len(chain) == 2 for chain in chains) and set(names) == set(rb.RAND_OPS)
    rotations = [m for chain in chains for name, m in chain if name == "Rotate"]
    assert {round(abs(m), 4) for m in rotations} == {9.0} and min(rotations) < 0 < max(rotations)
    assert all(m == 7.0 for chain in chains for name, m in chain if name == "Posterize")  # unsigned
    boxes = [rb.draw_erase(224, 0.25, draw) for _ in range(4000)]
    erased = [b for b in boxes if b is not None]
    assert 0.2 < len(erased) / len(boxes) < 0.3
    for top, left, h, w in erased:
        assert 0 <= top <= 224 - h and 0 <= left <= 224 - w and 0.02 * 0.9 <= h * w / 224**2 <= 0.33 * 1.1
    assert rb.draw_erase(224, 0.0, draw) is None
    kinds = [rb.draw_mix(20, 30, draw) for _ in range(400)]
    assert 0.4 < sum(k == "mixup" for k, _, _ in kinds) / 400 < 0.6
    for kind, lam, box in kinds:
        assert 0 <= lam <= 1
        if kind == "cutmix":  # a box of about 1 - lam of the image, at most the image
            y1, y2, x1, x2 = box
            assert 0 <= y1 <= y2 <= 20 and 0 <= x1 <= x2 <= 30


def test_yolo_matrix_and_boxes_move_as_ultralytics():
    matrix = rb.yolo_matrix(640, 0.5, 0.4, 0.6)
    assert np.allclose(matrix @ [640, 640, 1], [256, 384])  # the canvas's centre to (tx, ty) x size
    assert np.allclose(matrix @ [740, 640, 1], [306, 384])  # scaled by 0.5
    boxes = np.array([[640, 640, 740, 700], [0, 0, 10, 10], [700, 640, 703, 900]], np.float32)
    new, keep = rb._moved_boxes(boxes, matrix, 0.5, 640)
    assert np.allclose(new[0], [256, 384, 306, 414])
    assert keep.tolist() == [True, False, False]  # one off the image, one 1.5 px wide after the warp


@pytest.mark.parametrize("name", ["rrc", "deit", "yolo"])
def test_floor_runs_the_recipe_on_every_sample(name, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import recipe_floors

    rng = np.random.default_rng(0)
    shape = (96, 128) if name == "yolo" else (60, 70)
    images = [np.ascontiguousarray(synthetic_image(rng, *shape).transpose(2, 0, 1)) for _ in range(5)]
    floor = recipe_floors.Floor(name, images, 2)
    floor.size = 64 if name == "yolo" else 32
    floor.out = np.zeros((2, 3, floor.size, floor.size), np.uint8)
    params = floor.draw(1)
    assert [len(batch) for batch, _ in params] == [2, 2, 1]
    assert floor.run(params) == 5
    if name == "rrc":  # the last batch's one sample, by hand
        i, box, flip = params[-1][0][0]
        expected = rb.crop_resize(images[i], box, (32, 32), rb.resize_antialiased)
        expected = expected[:, ::-1] if flip else expected
        assert np.array_equal(floor.out[0], expected.transpose(2, 0, 1))
        assert floor.draw(1) == params  # drawn from the seed alone


def test_runner_times_passes_of_the_checkout_on_its_path(caches, tmp_path):
    """The parent suite's child: the cachekit of PYTHONPATH, a pass over the whole cache per request."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, str(ROOT / "benchmarks" / "recipe_runner.py"), "rrc", "--raw", str(tmp_path / "unused"),
           "--cache", str(caches[0]), "--batch-size", "3"]  # fmt: skip
    done = subprocess.run(
        cmd, input="pass\npass\nquit\n", capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    ready, *passes = [json.loads(line) for line in done.stdout.splitlines()]
    assert Path(ready["cachekit"]) == ROOT / "cachekit"
    assert [p["samples"] for p in passes] == [8, 8]
    assert all(p["cpu"] > 0 and p["wall"] > 0 for p in passes)


def test_parent_runner_refuses_a_tree_it_did_not_import(caches, tmp_path, monkeypatch):
    """A PATH without cachekit: the child imports the installed one, and the suite says so."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import recipe_floors

    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="imported cachekit from .*, not from .*empty"):
        recipe_floors._Runner(tmp_path / "empty", "rrc", tmp_path / "unused", caches[0], 4, 1)
    runner = recipe_floors._Runner(ROOT, "rrc", tmp_path / "unused", caches[0], 4, 1)
    try:
        assert runner.timed_pass()["samples"] == 8
    finally:
        runner.close()
    assert runner.proc.returncode == 0
