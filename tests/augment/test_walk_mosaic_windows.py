"""The walk's mosaic windows: each mosaic's pixel source is the part of its canvas the output reads."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cachekit.augment.geometric import RandomAffine, RandomVerticalFlip
from cachekit.augment.maps import draw_maps
from cachekit.augment.mosaic import Mosaic
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import CenterCrop, ColorJitter, Letterbox, RandomHorizontalFlip, Resize
from cachekit.augment.zoomcrop import RandomIoUCrop
from cachekit.constants import MAX_SIDE


def test_each_mosaic_reads_the_window_of_its_canvas_its_output_sees_unless_pre_resized_whole():
    s, n = 64, 200
    plan = compile_plan([Mosaic(s, p=0.6), RandomAffine(translate=(0.45, 0.45), scale=(0.2, 2.5))])
    extra = plan.extra_indices(4, 0, np.arange(n), 1000)
    hw = np.array([(40 + j % 50, 90 - j % 50) for j in range(n)])  # not square: height and width told apart
    extra_hw = np.tile(np.array([(100, 50), (64, 64), (30, 30)])[None], (n, 1, 1))
    g = plan.draw(4, 0, np.arange(n), hw[:, 0], hw[:, 1], extra=extra, extra_hw=extra_hw).general
    on, canvas = g.mosaic.on, g.mosaic.canvas
    whole = on & (g.shrink != g.source_hw).any(axis=1)  # pre-resized from the whole canvas (antialiased)
    cut = on & ~whole
    # the batch has singles, mosaics read whole, and mosaics read through a window, in mixed order
    assert (~on).any() and whole.any() and cut.any() and np.flatnonzero(whole)[0] < np.flatnonzero(cut)[-1]
    assert np.array_equal(
        g.windows[~on], np.stack([0 * hw[~on, 0], 0 * hw[~on, 0], hw[~on, 1], hw[~on, 0]], 1)
    )
    assert np.array_equal(g.source_hw[~on], hw[~on])
    assert (g.windows[whole] == [0, 0, canvas, canvas]).all() and (g.source_hw[whole] == canvas).all()
    for j in np.flatnonzero(cut):
        x0, y0, x1, y1 = g.windows[j]
        assert 0 <= x0 < x1 <= canvas and 0 <= y0 < y1 <= canvas and (x1 - x0 < canvas or y1 - y0 < canvas)
        assert g.source_hw[j].tolist() == [y1 - y0, x1 - x0] and g.shrink[j].tolist() == [y1 - y0, x1 - x0]
        # every output pixel's source lies in the window: its corners taken back through the map
        back = np.linalg.inv(g.matrices[j]) @ np.array([[0, s, 0, s], [0, 0, s, s], [1, 1, 1, 1]], np.float64)
        bx, by = back[0] / back[2], back[1] / back[2]
        assert (np.clip(bx, 0, canvas) >= x0).all() and (np.clip(bx, 0, canvas) <= x1).all()
        assert (np.clip(by, 0, canvas) >= y0).all() and (np.clip(by, 0, canvas) <= y1).all()
    # some windows are cut at the canvas's edge, and not square about its centre
    edge = (g.windows[cut] == 0) | (g.windows[cut] == canvas)
    assert (
        edge.any()
        and (g.windows[cut, 2:] == canvas).sum() > 2
        and (g.windows[cut, 0] != g.windows[cut, 1]).any()
    )
    assert g.fast is None and (g.mosaic.rows[~on] == -1).all() and (g.mosaic.rows[on] >= n).all()
    assert g.windows.dtype.kind == "i" and g.source_hw.dtype.kind == "i"  # slice bounds of the pixels
    # the pixel map reads the window as the box map reads the canvas
    shift = np.tile(np.eye(3), (n, 1, 1))
    shift[:, 0, 2], shift[:, 1, 2] = g.windows[:, 0], g.windows[:, 1]
    assert np.allclose(g.warps, g.matrices @ shift)


def test_a_mosaic_without_extra_samples_leaves_every_sample_single_and_letterboxed():
    plan = compile_plan([Mosaic(32), RandomAffine(scale=(0.5, 1.5))])
    g = draw_maps(plan.steps, 1, 0, np.arange(6), [40] * 6, [80] * 6)  # no extra samples given
    assert not g.mosaic.on.any() and (g.mosaic.extra == -1).all() and (g.mosaic.rows == -1).all()
    assert g.mosaic.extra.shape == (6, 3) and g.mosaic.rows.shape == (6, 3)
    assert g.out_size == (32, 32) and np.array_equal(g.source_hw, [[40, 80]] * 6)


def test_a_list_that_sets_no_fill_pads_with_0():
    h, w = np.array([20, 30]), np.array([40, 50])
    steps = compile_plan([RandomHorizontalFlip(1.0), CenterCrop(64), ColorJitter(0.2)]).steps
    g = draw_maps(steps, 0, 0, [0, 1], h, w)
    assert (g.matrices[:, 0, 0] < 0).all() and g.out_size == (64, 64)
    assert g.fill == 0  # a crop past the image is padded with 0


def test_a_mosaic_whose_first_extra_sample_is_index_0_is_a_mosaic():
    plan = compile_plan([Mosaic(32)])
    extra = np.array([[0, 0, 0], [-1, -1, -1], [0, 3, 9]])
    g = draw_maps(
        plan.steps, 1, 0, np.arange(3), [40] * 3, [80] * 3, extra=extra, extra_hw=np.full((3, 3, 2), 50)
    )
    assert g.mosaic.on.tolist() == [True, False, True] and g.fast is None
    assert g.mosaic.rows.tolist() == [[3, 4, 5], [-1, -1, -1], [6, 7, 8]]
    assert np.array_equal(g.mosaic.extra, extra)


def test_an_iou_crop_given_no_boxes_draws_as_with_none_in_each_image():
    plan = compile_plan([RandomIoUCrop(), Resize((32, 32))])
    h, w = [60, 70, 80], [90, 50, 64]
    given = draw_maps(plan.steps, 2, 0, np.arange(3), h, w, boxes=[np.zeros((0, 4))] * 3)
    none = draw_maps(plan.steps, 2, 0, np.arange(3), h, w)
    assert np.array_equal(given.matrices, none.matrices) and np.array_equal(
        given.keep_rects, none.keep_rects, True
    )


def test_sizes_that_differ_in_height_alone_are_refused_naming_the_steps_that_end_it():
    steps = compile_plan([RandomHorizontalFlip()]).steps
    with pytest.raises(
        ValueError, match="^augment gives outputs of different sizes for images of different sizes"
    ):
        draw_maps(steps, 0, 0, np.arange(2), [40, 41], [50, 50])
    with pytest.raises(
        ValueError, match=re.escape("RandomZoomOut, RandomIoUCrop or RandomRotation(expand=True)): end")
    ):
        draw_maps(steps, 0, 0, np.arange(2), [40, 41], [50, 50])
    with pytest.raises(
        ValueError,
        match=re.escape("end it with Letterbox, RandomResizedCrop, CenterCrop or Resize((height, width))"),
    ):
        draw_maps(steps, 0, 0, np.arange(2), [40, 40], [50, 51])


def test_an_output_side_may_be_max_side_but_not_past_it_and_no_samples_give_0_by_0():
    steps = compile_plan([RandomHorizontalFlip()]).steps
    assert draw_maps(steps, 0, 0, [0], [MAX_SIDE], [8]).out_size == (MAX_SIDE, 8)
    with pytest.raises(ValueError, match=f"outputs of {MAX_SIDE + 1} x 8 pixels"):
        draw_maps(steps, 0, 0, [0], [MAX_SIDE + 1], [8])
    assert draw_maps(compile_plan([Resize((20, 8))]).steps, 0, 0, [], [], []).out_size == (0, 0)


def test_the_crop_paths_maps_keep_the_images_sizes_and_the_fill():
    g = draw_maps(compile_plan([Letterbox(48, fill=7)]).steps, 0, 0, [0, 1], [20, 30], [40, 50])
    assert g.crops is not None and g.fill == 7 and np.array_equal(g.source_hw, [[20, 40], [30, 50]])


def test_a_whole_pixel_general_list_takes_its_crop_boxes_and_no_pre_resize():
    g = draw_maps(
        compile_plan([RandomVerticalFlip(1.0), CenterCrop(24)]).steps, 0, 0, [0, 1], [40, 50], [30, 60]
    )
    assert g.fast is not None and g.shrink is None
