"""Each geometric step's map at its edges: a rotation by a hair, perspective on a 2-pixel side, the
samples a zoom-out leaves alone, the IoU crop's bounds, the antialiasing pre-resize of perspective
maps and whole-pixel maps with both flips (found by mutation testing of ``cachekit.augment.matrices``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cachekit.augment.geometric import RandomPerspective, RandomRotation, RandomVerticalFlip
from cachekit.augment.maps import draw_maps
from cachekit.augment.matrices import as_boxes, shrink_sizes
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import CenterCrop, RandomHorizontalFlip, Resize
from cachekit.augment.zoomcrop import RandomIoUCrop, RandomZoomOut, iou_crop, iou_with
from cachekit.image.instances import box_corners


def _walk(steps: list, heights, widths, seed: int = 0):
    return draw_maps(compile_plan(steps).steps, seed, 0, np.arange(len(heights)), heights, widths)


def _diag(sx: float, sy: float, tx: float = 0.0, ty: float = 0.0) -> np.ndarray:
    return np.array([[sx, 0.0, tx], [0.0, sy, ty], [0.0, 0.0, 1.0]])


# -- rotation, perspective, zoom-out -----------------------------------------------------------------


def test_a_rotation_by_a_hair_expands_to_the_next_whole_pixel_as_torchvision():
    """0.003 degrees moves a 200 x 200 image's corners 0.005 px out: torchvision's rounding (to
    within 1e-4 of a pixel, then up) makes the canvas 202 x 202, and the map centres the image on it."""
    g = _walk([RandomRotation((0.003, 0.003), expand=True)], [200], [200])
    assert g.out_size == (202, 202)
    centre = g.matrices[0] @ np.array([100.0, 100.0, 1.0])
    assert np.allclose(centre[:2] / centre[2], [101.0, 101.0])


def test_perspective_moves_an_image_two_pixels_wide_and_goes_on_past_one_it_leaves():
    """A 1-pixel side is left as it is; the next samples are moved all the same, a 2-pixel-wide one
    too (its corners move up and down), each map taking the image's corners to its drawn ends."""
    g = _walk([RandomPerspective(0.9, p=1.0), Resize((16, 16))], [1, 40, 40, 2], [30, 2, 40, 40])
    assert np.allclose(g.matrices[0], _diag(16 / 30, 16 / 1))  # the resize alone
    for j, (h, w) in enumerate([(40, 2), (40, 40), (2, 40)], start=1):
        moved = np.linalg.inv(_diag(16 / w, 16 / h)) @ g.matrices[j]  # the perspective alone
        corners = np.array([[0, w - 1, w - 1, 0], [0, 0, h - 1, h - 1], [1, 1, 1, 1]], np.float64)
        ends = moved @ corners
        ends = ends[:2] / ends[2]
        assert not np.allclose(ends, corners[:2]), j
        assert np.allclose(ends, np.round(ends), atol=1e-6)  # whole pixels, as torchvision draws them
        assert (
            (ends[0] >= 0).all()
            and (ends[0] <= w - 1).all()
            and (ends[1] >= 0).all()
            and (ends[1] <= h - 1).all()
        )


def test_a_zoom_out_leaves_the_samples_it_does_not_draw_where_they_are():
    n = 40
    h, w = np.full(n, 30), np.full(n, 50)
    g = _walk([RandomZoomOut(side_range=(2.0, 3.0), p=0.5), Resize((24, 24))], h, w, seed=3)
    scale_x = g.matrices[:, 0, 0]
    alone = np.isclose(scale_x, 24 / 50)
    assert alone.any() and (~alone).any()
    assert np.allclose(g.matrices[alone], _diag(24 / 50, 24 / 30))  # no shift: the image is the view
    # the others: the image on a canvas 2-3 times its sides, placed in whole pixels within it
    canvas_w = 24 / scale_x[~alone]
    assert (canvas_w >= 100 - 1e-6).all() and (canvas_w <= 150 + 1e-6).all()
    assert canvas_w.min() < 110 and canvas_w.max() > 140  # drawn apart from whether it zooms
    left = g.matrices[~alone, 0, 2] / scale_x[~alone]
    assert (left >= 0).all() and (left <= canvas_w - 50 + 1e-6).all() and (left > 0).any()
    assert np.allclose(left, np.round(left))


# -- the IoU crop ---------------------------------------------------------------------------------


def _iou_draws(step: RandomIoUCrop, rounds: list[tuple[float, list[float]]]) -> np.ndarray:
    """One sample's uniforms: each round's option draw and its one trial's (w, h, left, top); the
    rounds not given draw the last option (1.0: left whole)."""
    per_round = 1 + 4 * step.trials
    u = np.full((1, step.ROUNDS * per_round), 0.99)
    for k, (option, trial) in enumerate(rounds):
        u[0, k * per_round] = option
        u[0, k * per_round + 1 : k * per_round + 5] = trial
    return u


def _scale_draw(step: RandomIoUCrop, fraction: float) -> float:
    """The uniform that draws a side of ``fraction`` of the view (a hair above, so the floor keeps it)."""
    return (fraction - step.min_scale) / (step.max_scale - step.min_scale) + 1e-7


def test_an_iou_crop_takes_a_crop_at_exactly_the_smallest_aspect_ratio():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    u = _iou_draws(step, [(0.0, [_scale_draw(step, 0.4), _scale_draw(step, 0.8), 0.0, 0.0])])
    box = np.array([[10.0, 30.0, 30.0, 50.0]])
    m, nh, nw, rects = iou_crop(step, u, np.array([100.0]), np.array([100.0]), [box])
    assert (nh[0], nw[0]) == (80, 40) and rects[0].tolist() == [0, 0, 40, 80]  # w / h = 0.5: in range


def test_an_iou_crop_may_be_one_pixel_square():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    u = _iou_draws(step, [(0.0, [0.5, 0.5, 0.0, 0.0])])
    m, nh, nw, rects = iou_crop(step, u, np.array([2.0]), np.array([2.0]), [np.array([[0.2, 0.2, 0.8, 0.8]])])
    assert (nh[0], nw[0]) == (1, 1) and rects[0].tolist() == [0, 0, 1, 1]


def test_a_box_centred_on_the_crops_bottom_edge_is_not_in_it():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    u = _iou_draws(step, [(0.0, [_scale_draw(step, 0.4), _scale_draw(step, 0.8), 0.0, 0.0])])
    box = np.array([[10.0, 70.0, 30.0, 90.0]])  # centre (20, 80): on the crop's bottom edge
    m, nh, nw, rects = iou_crop(step, u, np.array([100.0]), np.array([100.0]), [box])
    assert (nh[0], nw[0]) == (100, 100) and np.isnan(rects[0]).all() and np.allclose(m[0], np.eye(3))
    inside = np.array([[10.0, 69.0, 30.0, 89.0]])  # centre 79: in it
    m, nh, nw, rects = iou_crop(step, u, np.array([100.0]), np.array([100.0]), [inside])
    assert (nh[0], nw[0]) == (80, 40)


def test_an_option_of_1_leaves_the_sample_whole_though_a_later_round_would_crop():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    good = [_scale_draw(step, 0.4), _scale_draw(step, 0.8), 0.0, 0.0]
    box = np.array([[10.0, 30.0, 30.0, 50.0]])
    u = _iou_draws(step, [(0.75, good), (0.0, good)])
    m, nh, nw, rects = iou_crop(step, u, np.array([100.0]), np.array([100.0]), [box])
    assert (nh[0], nw[0]) == (100, 100) and np.isnan(rects[0]).all()
    u = _iou_draws(step, [(0.0, good)])  # the same crop drawn in the first round is taken
    assert iou_crop(step, u, np.array([100.0]), np.array([100.0]), [box])[1][0] == 80


def test_an_iou_crop_of_no_pixels_is_passed_over_without_a_warning():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    u = _iou_draws(step, [(0.0, [0.0, 0.0, 0.0, 0.0])])  # 0.3 of 2 pixels: 0 x 0, an aspect of 0 / 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m, nh, nw, rects = iou_crop(
            step, u, np.array([2.0]), np.array([2.0]), [np.array([[0.2, 0.2, 0.8, 0.8]])]
        )
    assert (nh[0], nw[0]) == (2, 2) and np.isnan(rects[0]).all()


def test_the_iou_of_boxes_and_crops_counts_the_overlap_of_both_axes():
    crops = np.array([[0.0, 0.0, 4.0, 1.0], [0.0, 5.0, 4.0, 9.0], [5.0, 0.0, 9.0, 1.0]])
    boxes = np.array([[0.0, 0.0, 4.0, 0.5], [0.0, 0.0, 2.0, 2.0]])
    # a box half a pixel tall in a 4 x 1 crop: 2 / 4; the square: 2 / (4 + 4 - 2); nothing in the far crop
    assert np.allclose(iou_with(boxes, crops), [[0.5, 1 / 3], [0.0, 0.0], [0.0, 0.0]])
    # the same turned a quarter: half a pixel wide in a 1 x 4 crop, nothing in the crop far to the right
    turned = iou_with(boxes[:, [1, 0, 3, 2]], crops[:, [1, 0, 3, 2]])
    assert np.allclose(turned, [[0.5, 1 / 3], [0.0, 0.0], [0.0, 0.0]])


# -- the antialiasing pre-resize -----------------------------------------------------------------


def test_no_pre_resize_unless_a_side_shrinks_by_more_than_half():
    hw = np.array([[40, 80]])
    assert shrink_sizes(np.eye(3)[None], hw, (40, 80)) is None
    assert shrink_sizes(_diag(0.5, 0.5)[None], hw, (20, 40)) is None  # exactly half: the warp alone
    assert shrink_sizes(_diag(0.25, 1.0)[None], hw, (40, 20)).tolist() == [[40, 20]]  # x alone
    assert shrink_sizes(_diag(1.0, 0.25)[None], hw, (10, 80)).tolist() == [[10, 80]]  # y alone


def test_each_sample_of_a_batch_is_pre_resized_by_its_own_scale_whatever_its_shift():
    hw = np.array([[40, 80], [40, 80], [200, 200]])
    maps = np.stack([_diag(0.25, 0.125, 7.0, 9.0), _diag(1.0, 1.0, 3.0, 5.0), _diag(0.004, 0.004, 1.0, 2.0)])
    got = shrink_sizes(maps, hw, (10, 10))
    assert got.tolist() == [[5, 20], [40, 80], [1, 1]] and got.dtype == np.int64  # never under a pixel


@pytest.mark.parametrize(
    "m",
    [
        [[0.05, 0.012, 3.0], [0.004, 0.07, -2.0], [2e-5, 3e-5, 1.0]],
        [[0.08, 0.01, 40.0], [0.03, 0.07, -20.0], [3e-4, 1e-4, 1.0]],  # strong: w 2.6 at the centre
    ],
)
def test_a_perspective_maps_pre_resize_is_its_derivative_where_the_outputs_centre_comes_from(m):
    h, w, out = 3000, 4000, (240, 320)
    m = np.array(m)

    def f(x, y):
        p = m @ np.array([x, y, 1.0])
        return p[:2] / p[2]

    src = np.linalg.solve(m, np.array([out[1] / 2, out[0] / 2, 1.0]))
    x, y = src[:2] / src[2]
    assert np.allclose(f(x, y), [out[1] / 2, out[0] / 2]) and abs(x - y) > 100
    eps = 1e-3
    fx = np.linalg.norm((f(x + eps, y) - f(x - eps, y)) / (2 * eps))
    fy = np.linalg.norm((f(x, y + eps) - f(x, y - eps)) / (2 * eps))
    assert fx < 0.5 and fy < 0.5
    want = [round(h * fy), round(w * fx)]
    assert shrink_sizes(m[None], np.array([[h, w]]), out).tolist() == [want]


# -- whole-pixel maps --------------------------------------------------------------------------------


def test_a_shear_along_one_axis_is_not_a_crop():
    for shear in (
        _diag(1.0, 1.0) + [[0, 0.5, 0], [0, 0, 0], [0, 0, 0]],
        _diag(1.0, 1.0) + [[0, 0, 0], [0.5, 0, 0], [0, 0, 0]],
    ):
        assert as_boxes(shear[None], (10, 10)) is None


def test_a_crop_flipped_both_ways_reads_the_same_box_as_unflipped():
    g = _walk([RandomVerticalFlip(1.0), RandomHorizontalFlip(1.0), CenterCrop(24)], [40, 40], [30, 30])
    boxes, hflips, vflips = g.fast
    assert boxes.tolist() == [[8, 3, 24, 24]] * 2 and hflips.all() and vflips.all()
    g = _walk([RandomVerticalFlip(1.0), CenterCrop((24, 20))], [40], [30])
    boxes, hflips, vflips = g.fast
    assert boxes.tolist() == [[8, 5, 24, 20]] and not hflips.any() and vflips.all()


def test_a_flipped_crop_resized_reads_its_box_in_source_pixels():
    steps = [RandomVerticalFlip(1.0), RandomHorizontalFlip(1.0), CenterCrop((24, 20)), Resize((12, 10))]
    boxes, hflips, vflips = _walk(steps, [40], [30]).fast
    assert boxes.tolist() == [[8, 5, 24, 20]] and hflips.all() and vflips.all()


def test_only_whole_pixel_boxes_of_a_pixel_or_more_are_crops():
    assert as_boxes(_diag(0.5, 0.5, 0.25, 0.0)[None], (10, 10)) is None  # left half a pixel
    assert as_boxes(_diag(10.0, 24.0)[None], (24, 10)) is not None  # one pixel, stretched
    boxes, hflips, vflips = as_boxes(_diag(10.0, 24.0, -30.0, -48.0)[None], (24, 10))
    assert boxes.tolist() == [[2, 3, 1, 1]] and not hflips.any() and not vflips.any()
    perspective = _diag(1.0, 1.0)
    perspective[2, 0] = 0.01
    assert as_boxes(perspective[None], (10, 10)) is None
    scaled = 2 * _diag(0.5, 0.5, -3.0, -4.0)  # the same map in other homogeneous coordinates
    assert as_boxes(scaled[None], (10, 10))[0].tolist() == [[8, 6, 20, 20]]


def test_boxes_through_a_perspective_map_are_the_box_round_their_projected_corners():
    m = np.array([[0.9, -0.3, 12.0], [0.25, 1.1, -4.0], [1e-3, -2e-3, 1.0]])
    boxes = np.array([[10.0, 20.0, 60.0, 45.0], [0.0, 0.0, 5.0, 90.0]])
    got = box_corners(boxes, np.repeat(m[None], 2, 0))
    for box, out in zip(boxes, got):
        x0, y0, x1, y1 = box
        p = m @ np.array([[x0, x1, x1, x0], [y0, y0, y1, y1], [1, 1, 1, 1]])
        px, py = p[0] / p[2], p[1] / p[2]
        assert np.allclose(out, [px.min(), py.min(), px.max(), py.max()])
    horizon = _diag(1.0, 1.0)
    horizon[2, 0] = -0.1  # x = 10 is on the horizon, past it behind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = box_corners(
            np.array([[0.0, 0.0, 10.0, 5.0], [0.0, 0.0, 5.0, 5.0]]), np.repeat(horizon[None], 2, 0)
        )
    assert got[0].tolist() == [0, 0, 0, 0] and np.allclose(got[1], [0, 0, 10, 10])


def test_an_iou_crop_takes_an_iou_of_exactly_the_option_and_shifts_by_its_corner():
    step = RandomIoUCrop(trials=1, sampler_options=(0.5, 1.0))
    u = _iou_draws(step, [(0.0, [_scale_draw(step, 0.4), _scale_draw(step, 0.8), 0.5, 0.25])])
    box = np.array([[30.0, 5.0, 70.0, 45.0]])  # in the crop (30, 5)-(70, 85), half of it: IoU 0.5
    m, nh, nw, rects = iou_crop(step, u, np.array([100.0]), np.array([100.0]), [box])
    assert (nh[0], nw[0]) == (80, 40) and rects[0].tolist() == [30, 5, 70, 85]
    assert np.allclose(m[0], _diag(1.0, 1.0, -30.0, -5.0))


def test_an_iou_crop_at_exactly_the_largest_aspect_ratio_and_a_centre_on_its_right_edge():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    u = _iou_draws(step, [(0.0, [_scale_draw(step, 0.8), _scale_draw(step, 0.4), 0.0, 0.0])])  # 80 x 40
    m, nh, nw, rects = iou_crop(
        step, u, np.array([100.0]), np.array([100.0]), [np.array([[10.0, 10.0, 30.0, 30.0]])]
    )
    assert (nh[0], nw[0]) == (40, 80)  # w / h = 2: in range
    on_edge = np.array([[70.0, 10.0, 90.0, 30.0]])  # centre x 80: the crop's right edge
    m, nh, nw, rects = iou_crop(step, u, np.array([100.0]), np.array([100.0]), [on_edge])
    assert (nh[0], nw[0]) == (100, 100)


def test_an_iou_crop_no_pixels_tall_is_passed_over_without_a_warning():
    step = RandomIoUCrop(trials=1, sampler_options=(0.0, 1.0))
    u = _iou_draws(step, [(0.0, [0.5, 0.0, 0.0, 0.0])])  # 0.65 x 100 wide, 0.3 x 2 = 0 tall: w / 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m, nh, nw, rects = iou_crop(
            step, u, np.array([2.0]), np.array([100.0]), [np.array([[0.2, 0.2, 0.8, 0.8]])]
        )
    assert (nh[0], nw[0]) == (2, 100)
