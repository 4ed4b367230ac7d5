"""The geometric transforms: their maps against exact references, threads against the device,
antialiasing, torchvision's parameter definitions, hostile arguments and draws from (seed, epoch, index)."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from carrierkit import move_boxes

from cachekit.augment.geometric import RandomAffine, RandomPerspective, RandomRotation, RandomVerticalFlip
from cachekit.augment.mosaic import Mosaic, canvas_window, render_canvas
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import CenterCrop, Letterbox, RandomHorizontalFlip, RandomResizedCrop, Resize
from cachekit.augment.warp import warp_batch, warp_planes
from cachekit.augment.warpmatrix import resize_chw, warp_fast_batch, warp_maps_batch, warp_sample
from cachekit.augment.zoomcrop import RandomIoUCrop, RandomZoomOut
from cachekit.tools.synthetic import synthetic_image

N = 4000  # samples for the statistics: a KS distance past 1.63 / sqrt(N) has odds under 1%
KS = 1.63 / math.sqrt(N)


def _images(n: int, seed: int = 0, size=(96, 128)) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.ascontiguousarray(synthetic_image(rng, *size).transpose(2, 0, 1)) for _ in range(n)]


def _draw(steps, images, seed: int = 0, epoch: int = 0, **extra):
    hw = np.array([im.shape[1:] for im in images])
    return compile_plan(steps).draw(seed, epoch, np.arange(len(images)), hw[:, 0], hw[:, 1], **extra)


def _cpu(images, draws) -> np.ndarray:
    g = draws.general
    out = np.zeros((len(images), images[0].shape[0], *draws.out_size), np.uint8)
    for j, img in enumerate(images):
        if g.fast is not None:
            boxes, hflips, vflips = g.fast
            t, left, h, w = boxes[j]
            inside = t >= 0 and left >= 0 and t + h <= img.shape[1] and left + w <= img.shape[2]
            warp_planes(img, boxes[j], bool(hflips[j]), bool(inside), out[j], draws.fill)
            out[j] = out[j][:, ::-1] if vflips[j] else out[j]
        else:
            warp_sample(
                img, False, g.matrices[j], out[j], draws.fill, None if g.shrink is None else g.shrink[j]
            )
    return out


def _device(images, draws) -> np.ndarray:
    g = draws.general
    hw = np.array([im.shape[1:] for im in images])
    canvas = torch.zeros(
        len(images), images[0].shape[0], int(hw[:, 0].max()), int(hw[:, 1].max()), dtype=torch.uint8
    )
    for j, img in enumerate(images):
        canvas[j, :, : img.shape[1], : img.shape[2]] = torch.from_numpy(img)
    if g.fast is not None:  # as the device stage does: the crop+resize path
        boxes, hflips, vflips = (torch.from_numpy(a) for a in g.fast)
        x = warp_fast_batch(canvas, boxes, hflips, vflips, torch.from_numpy(hw), draws.out_size, draws.fill)
        return x.round().clamp(0, 255).to(torch.uint8).numpy()
    shrink = None if g.shrink is None else torch.from_numpy(g.shrink)
    x = warp_maps_batch(
        canvas, torch.from_numpy(g.matrices), torch.from_numpy(hw), draws.out_size, draws.fill, shrink
    )
    return x.round().clamp(0, 255).to(torch.uint8).numpy()


def _ks_uniform(values: np.ndarray, lo: float, hi: float) -> float:
    v = np.sort((np.asarray(values) - lo) / (hi - lo))
    n = len(v)
    return float(max((np.arange(1, n + 1) / n - v).max(), (v - np.arange(n) / n).max()))


# -- exact references ------------------------------------------------------------------------------


def test_a_quarter_turn_is_numpys_rot90_on_threads_and_device():
    img = _images(1, size=(32, 32))[0]
    left = _draw([RandomRotation((90, 90))], [img])  # torchvision's rotation: counter-clockwise
    right = _draw([RandomAffine(degrees=(90, 90))], [img])  # torchvision's affine: clockwise
    assert np.array_equal(_cpu([img], left)[0], np.rot90(img, 1, axes=(1, 2)))
    assert np.array_equal(_cpu([img], right)[0], np.rot90(img, -1, axes=(1, 2)))
    assert np.array_equal(_device([img], left)[0], np.rot90(img, 1, axes=(1, 2)))
    tall = _images(1, size=(24, 40))[0]
    turned = _draw([RandomRotation((90, 90), expand=True)], [tall])
    assert turned.out_size == (40, 24)
    assert np.array_equal(_cpu([tall], turned)[0], np.rot90(tall, 1, axes=(1, 2)))


def test_vertical_flips_and_whole_pixel_shifts_are_exact():
    img = _images(1, size=(40, 60))[0]
    flipped = _draw([RandomVerticalFlip(1.0)], [img])
    assert flipped.general.fast is not None  # axis-aligned, whole pixels: the crop+resize path
    assert np.array_equal(_cpu([img], flipped)[0], img[:, ::-1])
    assert np.array_equal(_device([img], flipped)[0], img[:, ::-1])
    for seed in range(5):
        shifted = _draw([RandomAffine(translate=(0.3, 0.3), fill=7)], [img], seed=seed)
        tx, ty = (int(v) for v in shifted.general.matrices[0][:2, 2])
        ref = np.full_like(img, 7)
        ref[:, max(ty, 0) : 40 + min(ty, 0), max(tx, 0) : 60 + min(tx, 0)] = img[
            :, max(-ty, 0) : 40 - max(ty, 0), max(-tx, 0) : 60 - max(tx, 0)
        ]
        assert np.array_equal(_cpu([img], shifted)[0], ref)
        assert np.array_equal(_device([img], shifted)[0], ref)


def test_no_distortion_is_the_identity_and_a_zoom_out_places_the_image_on_its_canvas():
    img = _images(1, size=(30, 50))[0]
    same = _draw([RandomPerspective(0.0, p=1.0)], [img])
    assert np.array_equal(_cpu([img], same)[0], img)
    for seed in range(4):
        zoom = _draw([RandomZoomOut(fill=9, side_range=(1.5, 3.0), p=1.0)], [img], seed=seed)
        (h, w), (left, top) = zoom.out_size, zoom.general.matrices[0][:2, 2].astype(int)
        assert 45 <= h <= 90 and 75 <= w <= 150
        ref = np.full((3, h, w), 9, np.uint8)
        ref[:, top : top + 30, left : left + 50] = img
        assert np.array_equal(_cpu([img], zoom)[0], ref)


def test_maps_that_shrink_are_antialiased_as_torchvision_resizes():
    """A quarter-size affine map of a photo: the centre equals torch's antialiased resize within a
    level or two (plain bilinear sampling of a 1-pixel checkerboard would give 0s and 255s)."""
    img = _images(1, size=(128, 128), seed=4)[0]
    draws = _draw([RandomAffine(scale=(0.25, 0.25))], [img])
    assert draws.general.shrink is not None or draws.general.fast is not None  # pre-resized, or cropped
    ref = F.interpolate(torch.from_numpy(img)[None].float(), size=(32, 32), mode="bilinear", antialias=True)[
        0
    ]
    for out in (_cpu([img], draws)[0], _device([img], draws)[0]):
        diff = np.abs(out[:, 48:80, 48:80].astype(float) - ref.numpy())
        assert diff[:, 1:-1, 1:-1].mean() <= 2.0
    board = np.ascontiguousarray(
        np.broadcast_to((np.indices((128, 128)).sum(0) % 2 * 255).astype(np.uint8), (3, 128, 128))
    )
    out = _cpu([board], _draw([RandomAffine(scale=(0.25, 0.25), degrees=(30, 30))], [board]))[0]
    assert np.abs(out[:, 54:74, 54:74].astype(float) - 127.5).max() <= 12


@pytest.mark.parametrize(
    "steps",
    [
        [RandomRotation(30), Resize((64, 80))],
        [RandomAffine(20, translate=(0.1, 0.1), scale=(0.3, 1.2), shear=10, fill=114)],
        [RandomPerspective(0.6, p=1.0, fill=50), Resize((40, 40))],
        [RandomResizedCrop(48), RandomRotation(45)],
        [RandomAffine(5, scale=(0.8, 1.2), perspective=0.001), CenterCrop(64)],
    ],
)
def test_device_path_matches_the_threads(steps):
    images = _images(8, seed=5, size=(96, 128))
    draws = _draw(steps, images, seed=3)
    cpu, dev = _cpu(images, draws).astype(float), _device(images, draws).astype(float)
    diff = np.abs(cpu - dev)
    assert diff.mean() <= 1.0 and np.percentile(diff, 99) <= 3, (diff.mean(), diff.max())


# -- torchvision's parameter definitions ---------------------------------------------------------


def _plan_maps(step, h=100, w=200, seed=1):
    return compile_plan([step]).draw(seed, 0, np.arange(N), np.full(N, h), np.full(N, w)).general.matrices


def test_random_affine_draws_torchvisions_angle_scale_translation_and_shear():
    m = _plan_maps(RandomAffine(degrees=(-20, 30), scale=(0.5, 1.5)))
    angle = np.degrees(np.arctan2(m[:, 1, 0], m[:, 0, 0]))  # clockwise on screen, y down
    assert _ks_uniform(angle, -20, 30) < KS and _ks_uniform(np.hypot(m[:, 0, 0], m[:, 1, 0]), 0.5, 1.5) < KS
    centre = m @ np.array([100.0, 50.0, 1.0]) - np.array([100.0, 50.0, 1.0])  # rotation about the centre
    assert np.abs(centre).max() < 1e-9
    m = _plan_maps(RandomAffine(translate=(0.1, 0.3)))
    tx, ty = m[:, 0, 2], m[:, 1, 2]
    assert np.array_equal(tx, np.round(tx)) and set(tx.astype(int)) == set(range(-20, 21))
    assert ty.min() == -30 and ty.max() == 30 and abs(tx.mean()) < 0.6 and abs(ty.mean()) < 0.9
    m = _plan_maps(RandomAffine(shear=(-10, 10, -5, 5)))  # x shears then y (torchvision's RSS)
    sy = -np.degrees(np.arctan(m[:, 1, 0] / m[:, 1, 1]))
    assert _ks_uniform(sy, -5, 5) < KS
    m = _plan_maps(RandomAffine(shear=15))
    assert _ks_uniform(-np.degrees(np.arctan(m[:, 0, 1])), -15, 15) < KS and np.allclose(m[:, 1, 0], 0)
    m = _plan_maps(RandomAffine(perspective=0.001))
    assert _ks_uniform(m[:, 2, 0], -0.001, 0.001) < KS and _ks_uniform(m[:, 2, 1], -0.001, 0.001) < KS


def test_rotation_perspective_and_zoom_out_draw_torchvisions_parameters():
    m = _plan_maps(RandomRotation((-10, 40)))
    assert _ks_uniform(-np.degrees(np.arctan2(m[:, 1, 0], m[:, 0, 0])), -10, 40) < KS
    m = _plan_maps(RandomPerspective(0.5, p=0.3), h=101, w=201)
    corners = np.array([[0, 0, 1], [200, 0, 1], [200, 100, 1], [0, 100, 1]], float).T
    ends = m @ corners
    ends = (ends[:, :2] / ends[:, 2:]).round(6)
    moved = ~np.all(np.isclose(m, np.eye(3)), axis=(1, 2))
    assert abs(moved.mean() - 0.3) < 4 * math.sqrt(0.21 / N)
    x, y = ends[moved, 0], ends[moved, 1]  # [k, 4 corners]
    assert x[:, 0].min() == 0 and x[:, 0].max() == 50 and y[:, 0].max() == 25  # int(0.5 * 50) + 1 places
    assert x[:, 1].min() == 150 and x[:, 1].max() == 200 and y[:, 2].min() == 75
    ratio = []
    for seed in range(3):
        d = compile_plan([RandomZoomOut(side_range=(1.0, 4.0), p=1.0)]).draw(seed, 0, [0], [100], [200])
        ratio.append(d.out_size[1] / 200)
    zoom = [
        compile_plan([RandomZoomOut(p=0.5)]).draw(0, 0, [i], [100], [100]).out_size[0] for i in range(400)
    ]
    assert 0.4 < np.mean(np.array(zoom) > 100) < 0.6 and max(zoom) <= 400 and all(1 <= r <= 4 for r in ratio)


def test_iou_crops_keep_a_box_centre_with_enough_overlap_and_drop_the_others():
    rng = np.random.default_rng(0)
    boxes = []
    for _ in range(400):
        x, y = rng.uniform(0, 150, 3), rng.uniform(0, 70, 3)
        boxes.append(np.stack([x, y, x + rng.uniform(10, 50, 3), y + rng.uniform(10, 30, 3)], 1))
    step = RandomIoUCrop()
    draws = compile_plan([step, Resize((50, 50))]).draw(
        0, 0, np.arange(400), [100] * 400, [200] * 400, boxes=boxes
    )
    g = draws.general
    rects = g.keep_rects  # the crops, in the view they were taken of
    whole = np.isnan(rects[:, 0])
    assert 0.05 < whole.mean() < 0.4  # the leave-alone option (and options no crop met)
    w, h = rects[~whole, 2] - rects[~whole, 0], rects[~whole, 3] - rects[~whole, 1]
    assert (
        (w >= 0.3 * 200 - 1).all()
        and (h >= 0.3 * 100 - 1).all()
        and (w / h >= 0.5).all()
        and (w / h <= 2).all()
    )
    for j in np.flatnonzero(~whole)[:50]:
        b = boxes[j]
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        x0, y0, x1, y1 = rects[j]
        inside = (x0 < cx) & (cx < x1) & (y0 < cy) & (cy < y1)
        assert inside.any()
        moved, keep, owner = move_boxes(b, np.full(3, j), g, 0.0)
        assert np.array_equal(keep, inside & keep) and (owner == j).all()  # centres outside: dropped
        scale = [(x1 - x0) / 50, (y1 - y0) / 50]
        assert np.allclose(moved[keep][:, :2] * scale, np.maximum(b[keep][:, :2] - [x0, y0], 0), atol=1e-3)


def _box_iou(boxes: np.ndarray, rect: np.ndarray) -> np.ndarray:
    """torchvision's ``box_iou`` of xyxy ``boxes [K, 4]`` with one xyxy ``rect``."""
    ix = np.clip(np.minimum(boxes[:, 2], rect[2]) - np.maximum(boxes[:, 0], rect[0]), 0, None)
    iy = np.clip(np.minimum(boxes[:, 3], rect[3]) - np.maximum(boxes[:, 1], rect[1]), 0, None)
    inter = ix * iy
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + (rect[2] - rect[0]) * (rect[3] - rect[1]) - inter)


#: Steps before the crop, and where they take a stored box (on a 100 x 200 image): the crop is drawn
#: in the view they lead to.
BEFORE_CROP = {
    "as stored": ([], lambda b: b),
    "halved": ([Resize((50, 100))], lambda b: b / 2),
    "mirrored": ([RandomHorizontalFlip(1.0)], lambda b: np.stack([200 - b[:, 2], b[:, 1], 200 - b[:, 0], b[:, 3]], 1)),
}  # fmt: skip


@pytest.mark.parametrize("before", list(BEFORE_CROP))
@pytest.mark.parametrize("option", [0.0, 0.5, 0.7, 0.9])
def test_each_iou_crop_overlaps_a_box_whose_centre_it_holds_by_at_least_the_drawn_option(option, before):
    """torchvision's rule: a crop is taken only when some box whose centre it holds has IoU >= the
    drawn minimum with it. One option at a time (it is then the drawn one), over many samples:
    every crop meets it, and crops are still found (boxes large enough to meet even 0.9 now and then).
    After a resize or a flip, the rule holds in the view they lead to, where the crop is taken."""
    rng = np.random.default_rng(1)
    n, boxes = 300, []
    for _ in range(n):
        w, h = rng.uniform(60, 160, 3), rng.uniform(30, 80, 3)
        x, y = rng.uniform(0, 200 - w), rng.uniform(0, 100 - h)
        boxes.append(np.stack([x, y, x + w, y + h], 1))
    steps, in_view = BEFORE_CROP[before]
    step = RandomIoUCrop(sampler_options=(option,), min_scale=0.3)
    draws = compile_plan([*steps, step, Resize((50, 50))]).draw(
        3, 0, np.arange(n), [100] * n, [200] * n, boxes=boxes
    )
    rects = draws.general.keep_rects
    cropped = np.flatnonzero(~np.isnan(rects[:, 0]))
    assert len(cropped) > (n // 20 if option == 0.9 else n // 2)
    best = []
    for j in cropped:
        b, (x0, y0, x1, y1) = in_view(boxes[j]), rects[j]
        cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
        inside = (x0 < cx) & (cx < x1) & (y0 < cy) & (cy < y1)
        best.append(_box_iou(b[inside], rects[j]).max(initial=-1.0))
        assert best[-1] >= option, (j, best[-1], option)
    if option == 0.0:  # with no minimum, many crops overlap their boxes less than the others ask
        assert np.mean(np.array(best) < 0.5) > 0.3
        # each side's scale drawn on its own (torchvision draws two), so the crops' shapes vary,
        fx = (rects[cropped, 2] - rects[cropped, 0]) / (200 if before != "halved" else 100)
        fy = (rects[cropped, 3] - rects[cropped, 1]) / (100 if before != "halved" else 50)
        assert np.ptp(fx / fy) > 0.5  # (within the aspect ratio's bounds: 2 fx / fy in [0.5, 2])


def test_an_iou_crop_counts_only_the_boxes_whose_centres_it_holds():
    """A small box (its IoU with any crop under 0.06) and the image's left half: a crop overlapping the
    half by IoU >= 0.2 while leaving its centre out holds only the small box's centre, which does
    not overlap enough, so it is not taken (torchvision keeps the boxes inside before the IoU)."""
    n = 300
    pair = np.array([[0.0, 0.0, 100.0, 100.0], [180.0, 40.0, 190.0, 50.0]])
    step = RandomIoUCrop(sampler_options=(0.2,))
    draws = compile_plan([step, Resize((50, 50))]).draw(
        4, 0, np.arange(n), [100] * n, [200] * n, boxes=[pair] * n
    )
    rects = draws.general.keep_rects
    cropped = rects[~np.isnan(rects[:, 0])]
    assert len(cropped) > n // 2
    # every crop holds the half's centre (50, 50) and overlaps the half by 0.2 or more
    assert ((cropped[:, 0] < 50) & (50 < cropped[:, 2]) & (cropped[:, 1] < 50) & (50 < cropped[:, 3])).all()
    assert all(_box_iou(pair[:1], r)[0] >= 0.2 for r in cropped)


# -- mosaic ----------------------------------------------------------------------------------------


def test_mosaic_places_four_images_round_a_centre_as_ultralytics_does():
    s = 64
    plan = compile_plan([Mosaic(s)])
    extra = plan.extra_indices(3, 1, np.arange(300), 1000)
    assert (extra >= 0).all() and extra.max() < 1000 and len(np.unique(extra)) > 500
    assert np.array_equal(extra[7], plan.extra_indices(3, 1, [7], 1000)[0])  # whatever the batch
    assert not np.array_equal(extra, plan.extra_indices(3, 2, np.arange(300), 1000))  # a new epoch
    sizes = [(40, 80), (100, 50), (64, 64), (30, 30)]
    flat = [np.full((1, h, w), 10 * (k + 1), np.uint8) for k, (h, w) in enumerate(sizes)]
    hw = np.array([sizes[0]] * 300)
    extra_hw = np.tile(np.array(sizes[1:])[None], (300, 1, 1))
    draws = plan.draw(3, 1, np.arange(300), hw[:, 0], hw[:, 1], extra=extra, extra_hw=extra_hw)
    mosaic = draws.general.mosaic
    assert draws.out_size == (s, s) and mosaic.canvas == 2 * s and mosaic.on.all()
    centre = mosaic.regions[:, 0, 2:]  # the first image's bottom-right corner: (xc, yc)
    assert centre.min() >= s // 2 and centre.max() < 3 * s // 2 and np.ptp(centre) > s * 0.8
    for j in range(20):
        canvas = np.zeros((1, 2 * s, 2 * s), np.uint8)
        tiles = [torch.from_numpy(f) for f in flat]
        render_canvas(tiles, mosaic.tiles[j], mosaic.regions[j], 114, resize_chw, canvas)
        xc, yc = centre[j]
        for k, (dy, dx) in enumerate([(-1, -1), (-1, 0), (0, -1), (0, 0)]):  # the pixels round the centre
            assert canvas[0, yc + dy, xc + dx] == 10 * (k + 1)
        long_side = max(
            mosaic.regions[j, 0, 2] - mosaic.regions[j, 0, 0],
            mosaic.regions[j, 0, 3] - mosaic.regions[j, 0, 1],
        )
        assert long_side <= s
        found = (canvas == 40).sum()  # the fourth, 30x30, grown to 64x64 and cut at the canvas's edge
        assert found == (min(xc + s, 2 * s) - xc) * (min(yc + s, 2 * s) - yc)
    single = compile_plan([Mosaic(s, p=0.0)])
    none = single.extra_indices(0, 0, np.arange(10), 1000)
    d = single.draw(0, 0, np.arange(10), [40] * 10, [80] * 10, extra=none, extra_hw=np.zeros((10, 3, 2)))
    m = d.general.matrices[0]  # letterboxed: the longer side to s, centred
    assert np.allclose(m @ [0, 0, 1], [0, 16, 1]) and np.allclose(m @ [80, 40, 1], [64, 48, 1])


def test_a_mosaic_s_boxes_are_its_tiles_cut_at_the_canvas_s_edges():
    """Each image's whole box lands on the part of the canvas it covers (cut at the canvas's edges,
    as Ultralytics clips them), then through the view: a scale of 0.4 about the view's centre shows
    the whole canvas, ``x -> 0.4 x + 0.1 s``, so no edge of the output cuts anything further."""
    s, n = 64, 40
    plan = compile_plan([Mosaic(s), RandomAffine(scale=(0.4, 0.4))])
    extra = plan.extra_indices(5, 0, np.arange(n), 1000)
    sizes = [(40, 80), (100, 50), (64, 64), (30, 30)]
    hw = np.array([sizes[0]] * n)
    extra_hw = np.tile(np.array(sizes[1:])[None], (n, 1, 1))
    draws = plan.draw(5, 0, np.arange(n), hw[:, 0], hw[:, 1], extra=extra, extra_hw=extra_hw)
    g = draws.general
    rows = g.mosaic.rows
    owner = np.concatenate([[j, *rows[j]] for j in range(n)])
    boxes = np.array([[0, 0, w, h] for _ in range(n) for h, w in sizes], np.float64)
    moved, keep, sample = move_boxes(boxes, owner, g, 0.0)
    assert keep.all() and np.array_equal(sample, np.repeat(np.arange(n), 4))
    want = 0.4 * g.mosaic.regions.reshape(-1, 4) + 0.1 * s
    assert np.allclose(moved, want, atol=1e-3)
    cut = g.mosaic.regions.reshape(-1, 4)
    assert (cut[:, 2:] == 2 * s).any() and (cut[:, :2] == 0).any()  # some tiles were cut at an edge


# -- hostile arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomVerticalFlip(1.5),
        lambda: RandomVerticalFlip(float("nan")),
        lambda: RandomRotation(float("nan")),
        lambda: RandomRotation(-5),
        lambda: RandomRotation((30, 10)),
        lambda: RandomRotation(1e9),
        lambda: RandomRotation(10, fill=300),
        lambda: RandomRotation(10, center=(float("inf"), 0)),
        lambda: RandomAffine(translate=(0.5, 2.0)),
        lambda: RandomAffine(scale=(0.0, 1.0)),
        lambda: RandomAffine(scale=(1.0, 1e6)),
        lambda: RandomAffine(shear=90),
        lambda: RandomAffine(shear=(1, 2, 3)),
        lambda: RandomAffine(perspective=-0.1),
        lambda: RandomAffine(perspective=float("nan")),
        lambda: RandomPerspective(distortion_scale=1.5),
        lambda: RandomPerspective(p=-0.1),
        lambda: RandomZoomOut(side_range=(0.5, 2.0)),
        lambda: RandomZoomOut(side_range=(1.0, 1e9)),
        lambda: RandomZoomOut(fill=-1),
        lambda: RandomIoUCrop(min_scale=0.0),
        lambda: RandomIoUCrop(min_scale=0.9, max_scale=0.5),
        lambda: RandomIoUCrop(min_aspect_ratio=float("nan")),
        lambda: RandomIoUCrop(sampler_options=[]),
        lambda: RandomIoUCrop(sampler_options=[0.5, float("nan")]),
        lambda: RandomIoUCrop(trials=0),
        lambda: RandomIoUCrop(trials=10**9),
        lambda: Mosaic(0),
        lambda: Mosaic(10**6),
        lambda: Mosaic(640, p=2),
        lambda: Mosaic(640, fill=256),
        lambda: Mosaic((320, 640)),
    ],
)
def test_hostile_arguments_are_refused_in_one_line(make):
    with pytest.raises(ValueError) as info:
        make()
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


def test_plans_refuse_what_they_cannot_compose():
    with pytest.raises(ValueError, match="Mosaic must come first"):
        compile_plan([RandomAffine(10), Mosaic(64)])
    with pytest.raises(ValueError, match="at most one RandomIoUCrop"):
        compile_plan([RandomIoUCrop(), RandomIoUCrop(), Resize((8, 8))])
    with pytest.raises(ValueError, match="do not go together"):
        compile_plan([Mosaic(64), RandomIoUCrop()])
    with pytest.raises(ValueError, match="different sizes"):
        compile_plan([RandomZoomOut(p=1.0)]).draw(0, 0, np.arange(8), [50] * 8, [60] * 8)
    assert compile_plan([RandomZoomOut(p=1.0), Resize((20, 20))]).fixed_size() == (20, 20)
    assert compile_plan([Mosaic(64), RandomAffine(5)]).fixed_size() == (64, 64)
    assert compile_plan([RandomRotation(5, expand=True)]).fixed_size() is None


# -- draws --------------------------------------------------------------------------------------------


def test_maps_depend_on_seed_epoch_and_index_only():
    plan = compile_plan(
        [RandomAffine(10, (0.1, 0.1), (0.8, 1.2), 5), RandomPerspective(p=1.0), Resize((32, 32))]
    )
    idx = np.array([5, 9, 1000, 7])
    a = plan.draw(3, 1, idx, [100] * 4, [120] * 4).general.matrices
    alone = plan.draw(3, 1, idx[2:3], [100], [120]).general.matrices
    assert np.array_equal(a[2], alone[0])
    assert not np.allclose(a, plan.draw(3, 2, idx, [100] * 4, [120] * 4).general.matrices)
    assert not np.allclose(a, plan.draw(4, 1, idx, [100] * 4, [120] * 4).general.matrices)


@pytest.mark.parametrize(
    "steps", [[Letterbox(1)], [Resize((1, 1))], [Resize(1), CenterCrop(1)], [CenterCrop(1)]]
)
def test_one_pixel_outputs_work_on_threads_and_device(steps):
    images = _images(3, size=(40, 60))
    hw = np.array([im.shape[1:] for im in images])
    draws = compile_plan(steps).draw(0, 0, np.arange(3), hw[:, 0], hw[:, 1])
    assert draws.out_size == (1, 1)
    out = np.zeros((3, 3, 1, 1), np.uint8)
    inside = draws.inside(hw[:, 0], hw[:, 1])
    for j, img in enumerate(images):
        pre = draws.pre[j] if draws.pre is not None else None
        warp_planes(img, draws.boxes[j], bool(draws.flips[j]), bool(inside[j]), out[j], draws.fill, pre)
    canvas = torch.from_numpy(np.stack(images))
    pre = torch.from_numpy(draws.pre) if draws.pre is not None else None
    dev = warp_batch(canvas, torch.from_numpy(draws.boxes), torch.from_numpy(draws.flips), torch.from_numpy(hw),
                     (1, 1), draws.fill, pre)  # fmt: skip
    assert np.abs(dev.numpy() - out).max() <= 1.5
    if not isinstance(steps[-1], CenterCrop):  # the whole image in one pixel: about its mean
        means = np.stack(images).reshape(3, 3, -1).mean(-1)
        assert np.abs(out[:, :, 0, 0] - means).max() <= 12


def test_tiny_images_and_degenerate_corners_draw_maps_that_warp():
    steps = [
        RandomPerspective(1.0, p=1.0),
        RandomRotation(30),
        RandomAffine(10, scale=(0.5, 2.0)),
        Resize((4, 4)),
    ]
    sizes = [(1, 1), (2, 1), (1, 2), (3, 3), (2, 5)]
    images = [np.full((3, h, w), 100 + k, np.uint8) for k, (h, w) in enumerate(sizes)]
    for seed in range(20):
        draws = _draw(steps, images, seed=seed)
        assert np.isfinite(draws.general.matrices).all()
        out = _cpu(images, draws)
        assert out.shape == (5, 3, 4, 4)


def test_a_mosaic_warped_from_the_window_it_shows_equals_one_warped_from_its_whole_canvas():
    s, n = 48, 12
    plan = compile_plan(
        [Mosaic(s), RandomAffine(20, translate=(0.2, 0.2), scale=(0.6, 2.5), shear=5, fill=3)]
    )
    extra = plan.extra_indices(0, 0, np.arange(n), 100)
    images = _images(4, seed=2, size=(40, 70))
    hw = np.array([[40, 70]] * n)
    draws = plan.draw(
        0, 0, np.arange(n), hw[:, 0], hw[:, 1], extra=extra, extra_hw=np.full((n, 3, 2), [40, 70])
    )
    g, windows = draws.general, 0
    sources = [torch.from_numpy(im) for im in images]
    for j in range(n):
        full = np.zeros((3, 2 * s, 2 * s), np.uint8)
        render_canvas(sources, g.mosaic.tiles[j], g.mosaic.regions[j], g.mosaic.fill, resize_chw, full)
        whole = np.zeros((3, s, s), np.uint8)
        warp_sample(full, False, g.matrices[j], whole, draws.fill)
        x0, y0, x1, y1 = canvas_window(g.matrices[j], draws.out_size, 2 * s)
        windows += (x1 - x0) * (y1 - y0) < (2 * s) ** 2
        part = np.zeros((3, y1 - y0, x1 - x0), np.uint8)
        render_canvas(
            sources, g.mosaic.tiles[j], g.mosaic.regions[j], g.mosaic.fill, resize_chw, part, (x0, y0)
        )
        shifted = np.zeros_like(whole)
        warp_sample(
            part, False, g.matrices[j] @ np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1.0]]), shifted, draws.fill
        )
        assert np.abs(shifted.astype(int) - whole).max() <= 1
    assert windows >= n // 2  # most views see less than the whole canvas


def test_horizontal_flips_are_drawn_alike_with_and_without_general_maps():
    idx = np.arange(500)
    plain = compile_plan([Resize((32, 32)), RandomHorizontalFlip()]).draw(2, 1, idx, [40] * 500, [60] * 500)
    turned = compile_plan([Resize((32, 32)), RandomHorizontalFlip(), RandomRotation(0)]).draw(
        2, 1, idx, [40] * 500, [60] * 500
    )
    assert np.array_equal(plain.flips, turned.general.matrices[:, 0, 0] < 0)


# -- torchvision's formulas, written out: the reference CI runs (torchvision itself is not installed) --


def _tv_affine(center, angle, translate, scale, shear, inverted: bool) -> np.ndarray:
    """torchvision's ``_get_inverse_affine_matrix`` (``M = T * C * RSS * C^-1``), line by line, as 3x3."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    (cx, cy), (tx, ty) = center, translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -(a * math.tan(sx) + math.sin(rot))
    c = math.sin(rot - sy) / math.cos(sy)
    d = -(c * math.tan(sx) - math.cos(rot))
    if inverted:
        m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
        m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty)
        m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty)
    else:
        m = [a * scale, b * scale, 0.0, c * scale, d * scale, 0.0]
        m[2] += cx + tx - m[0] * cx - m[1] * cy
        m[5] += cy + ty - m[3] * cx - m[4] * cy
    return np.array([m[:3], m[3:], [0.0, 0.0, 1.0]])


def _tv_expanded_size(inverse_centred: np.ndarray, w: int, h: int) -> tuple[int, int]:
    """torchvision's ``_compute_affine_output_size``: (height, width) holding the turned image."""
    f = np.float32  # torchvision works in float32, its 1e-4 truncation too
    pts = np.array([[-w / 2, -h / 2, 1], [-w / 2, h / 2, 1], [w / 2, h / 2, 1], [w / 2, -h / 2, 1]], f)
    moved = pts @ inverse_centred[:2].T.astype(f)
    halfs = np.array([w / 2, h / 2], f)
    lo, hi = moved.min(0) + halfs, moved.max(0) + halfs
    tol, inv_tol = f(1e-4), f(1.0 / 1e-4)
    size = np.ceil(np.trunc(hi * inv_tol) * tol) - np.floor(np.trunc(lo * inv_tol) * tol)
    return int(size[1]), int(size[0])


def _tv_perspective_coefficients(start, end) -> np.ndarray:
    """torchvision's ``_perspective_coefficients``: the 8 numbers taking ``end`` points to ``start``
    ones (output to input), by least squares, as 3x3."""
    a = np.zeros((8, 8))
    for i, ((x, y), (u, v)) in enumerate(zip(end, start)):
        a[2 * i] = [x, y, 1, 0, 0, 0, -u * x, -u * y]
        a[2 * i + 1] = [0, 0, 0, x, y, 1, -v * x, -v * y]
    c = np.linalg.lstsq(a, np.asarray(start, np.float64).reshape(8), rcond=None)[0]
    return np.append(c, 1.0).reshape(3, 3)


def _tv_warp(img: np.ndarray, inverse: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """torchvision's image warp: each output pixel's centre through ``inverse`` (continuous
    coordinates, pixel ``i`` covering ``[i, i + 1)``), ``grid_sample`` bilinear, ``align_corners=False``."""
    oh, ow = out_hw
    h, w = img.shape[1:]
    ys, xs = np.meshgrid(np.arange(oh) + 0.5, np.arange(ow) + 0.5, indexing="ij")
    src = np.stack([xs, ys, np.ones_like(xs)], -1) @ inverse.T
    grid = src[..., :2] / src[..., 2:] / [w / 2, h / 2] - 1.0
    x = torch.from_numpy(img).float()[None]
    out = F.grid_sample(x, torch.from_numpy(grid).float()[None], mode="bilinear", align_corners=False)
    return out[0].round().clamp(0, 255).numpy()


def _same_pixels(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    inner = (slice(None), slice(8, -8), slice(8, -8))
    diff = np.abs(ours[inner].astype(float) - ref[inner])
    assert diff.mean() < 0.5 and np.percentile(diff, 99) <= 2, (what, diff.mean(), diff.max())


@pytest.mark.parametrize(
    "step",
    [
        RandomAffine((25, 25), translate=(0.1, 0.1), scale=(1.1, 1.1)),
        RandomAffine((-40, -40), scale=(0.9, 0.9), shear=(12, 12)),
        RandomAffine((0, 0), shear=(20, 20, 15, 15)),
        RandomAffine((-10, 30), translate=(0.2, 0.05), scale=(0.7, 1.3), shear=(-8, 8, -4, 4)),
        RandomAffine((10, 10), translate=(0.1, 0.1), scale=(0.9, 0.9), perspective=0.001),
    ],
)
def test_affine_maps_are_torchvisions_formula(step):
    """The drawn parameters (torchvision's ``get_params`` on the draw's uniforms) through torchvision's
    matrix, forward (boxes) and inverse (pixels); the pixels as torchvision's grid samples them.
    Ultralytics' perspective terms act on the centred image, before the rest of the map."""
    from cachekit.augment.matrices import draw_uniforms

    h, w, n = 96, 128, 6
    maps = _plan_maps(step, h, w, seed=2)[:n]
    u = draw_uniforms(2, 0, np.arange(n), 1, step)
    (a0, a1), (sx0, sx1, sy0, sy1) = (
        step.degrees if isinstance(step.degrees, tuple) else (0, 0),
        step.shear_ranges,
    )
    images = _images(n, seed=6, size=(h, w))
    draws = compile_plan([step]).draw(2, 0, np.arange(n), [h] * n, [w] * n)
    ours = _cpu(images, draws)
    device = _device(images, draws)
    for j in range(n):
        angle = a0 + u[j, 0] * (a1 - a0)
        tx = ty = 0.0
        if step.translate is not None:
            dx, dy = step.translate[0] * w, step.translate[1] * h
            tx, ty = round(-dx + u[j, 1] * 2 * dx), round(-dy + u[j, 2] * 2 * dy)
        scale = 1.0 if step.scale is None else step.scale[0] + u[j, 3] * (step.scale[1] - step.scale[0])
        shear = (sx0 + u[j, 4] * (sx1 - sx0), sy0 + u[j, 5] * (sy1 - sy0))
        forward = _tv_affine((w / 2, h / 2), angle, (tx, ty), scale, shear, inverted=False)
        inverse = _tv_affine((w / 2, h / 2), angle, (tx, ty), scale, shear, inverted=True)
        if step.perspective:  # Ultralytics' P, between centring and the rest: M = T S R P C
            p = np.eye(3)
            p[2, :2] = (2 * u[j, 6] - 1) * step.perspective, (2 * u[j, 7] - 1) * step.perspective
            centre = np.array([[1.0, 0, w / 2], [0, 1, h / 2], [0, 0, 1]])
            forward = forward @ centre @ p @ np.linalg.inv(centre)
            inverse = np.linalg.inv(forward)
        assert np.allclose(maps[j], forward, atol=1e-9), j
        assert np.allclose(np.linalg.inv(maps[j]), inverse, atol=1e-9), j
        ref = _tv_warp(images[j], inverse, (h, w))
        _same_pixels(ours[j], ref, f"threads {j}")
        _same_pixels(device[j], ref, f"device {j}")


def test_a_rotation_about_a_given_centre_is_torchvisions():
    """``center=(x, y)``: torchvision's ``rotate`` turns about that point of the image (x across)."""
    h, w = 96, 128
    img = _images(1, seed=8, size=(h, w))[0]
    draws = _draw([RandomRotation((25, 25), center=(30.0, 70.0))], [img])
    inverse = _tv_affine((30.0, 70.0), -25, (0.0, 0.0), 1.0, (0.0, 0.0), inverted=True)
    assert np.allclose(np.linalg.inv(draws.general.matrices[0]), inverse, atol=1e-9)
    assert np.allclose(draws.general.matrices[0] @ [30.0, 70.0, 1.0], [30.0, 70.0, 1.0])
    ref = _tv_warp(img, inverse, (h, w))
    _same_pixels(_cpu([img], draws)[0], ref, "threads")
    _same_pixels(_device([img], draws)[0], ref, "device")


@pytest.mark.parametrize("expand", [False, True])
@pytest.mark.parametrize("deg", [30, -71, 90])
def test_rotations_are_torchvisions_formula(deg, expand):
    """torchvision's ``rotate``: ``affine`` by minus the angle (counter-clockwise), about the centre;
    ``expand`` sizes the output by ``_compute_affine_output_size`` and centres the turned image in it."""
    h, w = 96, 128
    img = _images(1, seed=6, size=(h, w))[0]
    draws = _draw([RandomRotation((deg, deg), expand=expand)], [img])
    centred = _tv_affine((0.0, 0.0), -deg, (0.0, 0.0), 1.0, (0.0, 0.0), inverted=True)
    oh, ow = _tv_expanded_size(centred, w, h) if expand else (h, w)
    assert draws.out_size == (oh, ow)
    # the output's centre is the input's, each in its own frame: T(out centre) * R * T(-in centre)
    inverse = _tv_affine((0.0, 0.0), -deg, (0.0, 0.0), 1.0, (0.0, 0.0), inverted=True)
    to_out = np.array([[1.0, 0, -ow / 2], [0, 1, -oh / 2], [0, 0, 1]])
    from_in = np.array([[1.0, 0, w / 2], [0, 1, h / 2], [0, 0, 1]])
    inverse = from_in @ inverse @ to_out
    assert np.allclose(np.linalg.inv(draws.general.matrices[0]), inverse, atol=1e-9)
    ref = _tv_warp(img, inverse, (oh, ow))
    _same_pixels(_cpu([img], draws)[0], ref, "threads")
    _same_pixels(_device([img], draws)[0], ref, "device")


def test_perspective_maps_are_torchvisions_eight_coefficients():
    """torchvision's ``RandomPerspective.get_params`` on the draw's uniforms gives the corners; its
    ``_perspective_coefficients`` (output to input) is the inverse of our map, and its grid the pixels."""
    from cachekit.augment.matrices import draw_uniforms

    h, w, n = 96, 128, 6
    step = RandomPerspective(0.5, p=1.0)
    images = _images(n, seed=7, size=(h, w))
    draws = compile_plan([step]).draw(5, 0, np.arange(n), [h] * n, [w] * n)
    u = draw_uniforms(5, 0, np.arange(n), 1, step)
    ours, device = _cpu(images, draws), _device(images, draws)
    bh, bw = int(0.5 * (h // 2)) + 1, int(0.5 * (w // 2)) + 1

    def randint(x, lo, hi):
        return lo + int(x * (hi - lo))

    for j in range(n):
        r = u[j, 1:]
        end = [[randint(r[0], 0, bw), randint(r[1], 0, bh)], [randint(r[2], w - bw, w), randint(r[3], 0, bh)],
               [randint(r[4], w - bw, w), randint(r[5], h - bh, h)], [randint(r[6], 0, bw), randint(r[7], h - bh, h)]]  # fmt: skip
        start = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
        inverse = _tv_perspective_coefficients(start, end)
        ours_inverse = np.linalg.inv(draws.general.matrices[j])
        assert np.allclose(ours_inverse / ours_inverse[2, 2], inverse, atol=1e-6), j
        ref = _tv_warp(images[j], inverse, (h, w))
        _same_pixels(ours[j], ref, f"threads {j}")
        _same_pixels(device[j], ref, f"device {j}")


def test_zoom_out_and_vertical_flip_are_torchvisions():
    """``RandomZoomOut``: a canvas ``int(side * r)`` with the image at ``int((canvas - side) * r')``;
    ``RandomVerticalFlip``: ``y -> h - y``."""
    from cachekit.augment.matrices import draw_uniforms

    h, w, n = 30, 50, 40
    step = RandomZoomOut(side_range=(1.2, 3.0), p=1.0)
    for j in range(n):
        draws = compile_plan([step]).draw(1, 0, [j], [h], [w])
        u = draw_uniforms(1, 0, np.array([j]), 1, step)[0]
        r = 1.2 + u[1] * 1.8
        ch, cw = int(h * r), int(w * r)
        left, top = int((cw - w) * u[2]), int((ch - h) * u[3])
        assert draws.out_size == (ch, cw)
        assert np.array_equal(draws.general.matrices[0], [[1, 0, left], [0, 1, top], [0, 0, 1]])
    flipped = compile_plan([RandomVerticalFlip(1.0), RandomRotation(0)]).draw(0, 0, [0], [h], [w])
    assert np.allclose(flipped.general.matrices[0], [[1, 0, 0], [0, -1, h], [0, 0, 1]])


@pytest.mark.parametrize(
    "steps",
    [
        [RandomResizedCrop((40, 64), scale=(0.2, 1.0)), RandomHorizontalFlip()],
        [CenterCrop((40, 90)), RandomHorizontalFlip()],
        [Letterbox(64), RandomHorizontalFlip()],
        [Resize(48), CenterCrop((48, 40)), RandomHorizontalFlip()],
        [Resize((30, 50)), RandomHorizontalFlip(), RandomResizedCrop((24, 36))],
    ],
)
def test_crops_resizes_and_flips_map_alike_with_and_without_general_maps(steps):
    """A list that also turns (by 0 degrees, at its end) draws each sample's crop, resize and flip as
    the crop+resize path does and composes them into the same map: portrait and landscape images,
    outputs that are not square (a flip mirrors across the width, never the height)."""
    rng = np.random.default_rng(3)
    n = 64
    heights, widths = rng.integers(60, 140, n), rng.integers(60, 140, n)
    heights[:4], widths[:4] = (130, 70, 61, 100), (70, 130, 100, 61)  # both orientations, surely
    idx = np.arange(n)
    plain = compile_plan(steps).draw(4, 1, idx, heights, widths)
    general = compile_plan([*steps, RandomRotation((0, 0))]).draw(4, 1, idx, heights, widths)
    assert plain.general is None and general.general is not None and plain.out_size == general.out_size
    sx, sy, tx, ty = plain.maps()
    m = general.general.matrices
    assert plain.flips.any() and not plain.flips.all()
    assert np.allclose(m[:, [0, 1, 2, 2], [1, 0, 0, 1]], 0) and np.allclose(m[:, 2, 2], 1)
    if isinstance(steps[0], Letterbox):
        # the crop+resize path takes the letterbox's view as a box of whole source pixels; the map
        # keeps YOLO's own scale (sides rounded): the image's corners land within a pixel of each other
        corners = np.stack([np.zeros(n), np.zeros(n), widths, heights], 1)
        ours = np.stack([m[:, 0, 0] * corners[:, 0] + m[:, 0, 2], m[:, 1, 1] * corners[:, 1] + m[:, 1, 2],
                         m[:, 0, 0] * corners[:, 2] + m[:, 0, 2], m[:, 1, 1] * corners[:, 3] + m[:, 1, 2]], 1)  # fmt: skip
        theirs = np.stack([sx * corners[:, 0] + tx, sy * corners[:, 1] + ty,
                           sx * corners[:, 2] + tx, sy * corners[:, 3] + ty], 1)  # fmt: skip
        assert np.abs(ours - theirs).max() <= 1.0
        return
    assert np.allclose(m[:, 0, 0], sx) and np.allclose(m[:, 1, 1], sy), (m[:3], sx[:3], sy[:3])
    assert np.allclose(m[:, 0, 2], tx) and np.allclose(m[:, 1, 2], ty), (m[:3], tx[:3], ty[:3])


def test_maps_equal_torchvisions_own_where_it_is_installed():
    """torchvision v2's ``affine``, ``rotate`` (expanded too) and ``perspective`` on the same image:
    the same pixels within a level and the same boxes (checked with torchvision 0.28). Where it is
    not installed (CI), the tests above check the same against its formulas written out."""
    tv = pytest.importorskip("torchvision.transforms.v2.functional")
    from torchvision import tv_tensors
    from torchvision.transforms import InterpolationMode

    from cachekit.augment.matrices import affine_matrices
    from cachekit.image.instances import box_corners

    img = _images(1, seed=6, size=(96, 128))[0]
    t, inner, box = (
        torch.from_numpy(img),
        (slice(None), slice(8, -8), slice(8, -8)),
        [[30.0, 20.0, 70.0, 50.0]],
    )
    for a, tx, ty, s, shx, shy in [(25, 5, -7, 1.1, 0, 0), (-40, 0, 0, 0.9, 12, 0), (0, 0, 0, 1.0, 20, 15)]:
        m = affine_matrices(*(np.array([float(v)]) for v in (a, tx, ty, s, shx, shy, 64, 48)))[0]
        ref = tv.affine(t, angle=a, translate=[tx, ty], scale=s, shear=[shx, shy],
                        interpolation=InterpolationMode.BILINEAR).numpy()  # fmt: skip
        out = np.zeros_like(img)
        warp_sample(img, False, m, out)
        assert np.abs(out[inner].astype(float) - ref[inner]).mean() < 0.5
        boxes = tv_tensors.BoundingBoxes(torch.tensor(box), format="XYXY", canvas_size=(96, 128))
        ref_box = tv.affine(boxes, angle=a, translate=[tx, ty], scale=s, shear=[shx, shy]).numpy()
        assert np.allclose(
            np.clip(box_corners(np.array(box), m[None]), 0, [128, 96, 128, 96]), ref_box, atol=0.05
        )
    for deg in (30, -71):
        draws = _draw([RandomRotation((deg, deg), expand=True)], [img])
        ref = tv.rotate(t, deg, expand=True, interpolation=InterpolationMode.BILINEAR).numpy()
        assert ref.shape[1:] == draws.out_size
        assert np.abs(_cpu([img], draws)[0][inner].astype(float) - ref[inner]).mean() < 0.5
    start, end = [[0, 0], [127, 0], [127, 95], [0, 95]], [[10, 5], [120, 8], [125, 90], [3, 85]]
    m = cv2.getPerspectiveTransform(np.float32(start), np.float32(end)).astype(
        np.float64
    )  # as matrices.perspective
    ref = tv.perspective(t, start, end, interpolation=InterpolationMode.BILINEAR).numpy()
    out = np.zeros_like(img)
    warp_sample(img, False, m, out)
    assert np.abs(out[inner].astype(float) - ref[inner]).mean() < 0.5


def test_an_output_past_the_largest_side_is_refused_before_it_is_allocated():
    # a 16x zoom-out of a 1000-pixel image would be 16000 x 16000 (768 MB a sample); of a stored 8192
    # image, 51 GB: refused in one line when drawn, not attempted
    plan = compile_plan([RandomZoomOut(side_range=(16.0, 16.0), p=1.0)])
    with pytest.raises(ValueError, match="past the largest side"):
        plan.draw(0, 0, np.arange(2), [1000, 1000], [1000, 1000])
    draws = compile_plan([RandomZoomOut(side_range=(16.0, 16.0), p=1.0), Resize((32, 32))]).draw(
        0, 0, np.arange(2), [1000, 1000], [1000, 1000]
    )
    assert draws.out_size == (32, 32)


def test_a_box_just_past_the_edge_is_dropped_not_kept_as_a_zero_width_sliver():
    # box_corners puts the left edge at 49.99999999999999 of a 50-pixel output: clipped, 1e-14 px wide,
    # kept even by min_visibility=0, and 0 px wide once float32
    plan = compile_plan([RandomZoomOut(p=1.0), RandomResizedCrop(50, scale=(0.05, 0.3))], min_visibility=0.0)
    n = 400
    draws = plan.draw(0, 0, np.arange(n), [100] * n, [100] * n)
    moved, keep, _ = move_boxes(np.array([[20.0, 20.0, 60.0, 50.0]] * n), np.arange(n), draws.geometry(), 0.0)
    assert keep.sum() > 50
    assert (moved[keep, 2] > moved[keep, 0]).all() and (moved[keep, 3] > moved[keep, 1]).all()


def test_a_box_with_a_corner_past_the_horizon_is_dropped_and_strong_perspective_refused():
    """A perspective map folds the plane where ``w <= 0``: the box round corners on both sides of the
    horizon would frame nothing, so such a box is emptied (and then dropped); perspective terms past
    Ultralytics' range (0.001), where a 640 px image already folds, are refused in one line."""
    from cachekit.image.instances import box_corners

    m = np.eye(3)[None].repeat(2, axis=0)
    m[:, 2, 0] = -0.01  # w = 1 - 0.01 x: the horizon at x = 100
    boxes = np.array([[10.0, 10.0, 50.0, 40.0], [80.0, 10.0, 120.0, 40.0]])
    moved = box_corners(boxes, m)
    assert np.all(moved[1] == 0.0)  # straddles the horizon: empty
    assert moved[0, 2] > moved[0, 0] and moved[0, 3] > moved[0, 1]  # in front of it: a real box
    with pytest.raises(ValueError, match="perspective"):
        RandomAffine(perspective=0.002)
