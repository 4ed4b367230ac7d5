"""The walk's results as its consumers take them: the types of its sizes and indices, and what a
whole-pixel general list leaves out (found by mutation testing of ``cachekit.augment.maps``)."""

from __future__ import annotations

import numpy as np

from cachekit.augment.geometric import RandomAffine, RandomVerticalFlip
from cachekit.augment.maps import draw_maps
from cachekit.augment.mosaic import Mosaic
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import RandomResizedCrop, Resize


def test_a_leading_resize_gives_whole_pixel_sizes_for_the_crop_path():
    g = draw_maps(
        compile_plan([Resize((30, 45)), RandomResizedCrop(16)]).steps, 3, 0, [0, 1], [60, 90], [90, 60]
    )
    assert g.crops is not None and g.crops.pre.dtype == np.int64
    assert g.crops.pre.tolist() == [[30, 45], [30, 45]]


def test_a_mosaic_given_no_extra_samples_keeps_integer_indices():
    g = draw_maps(compile_plan([Mosaic(32), RandomAffine()]).steps, 1, 0, np.arange(3), [40] * 3, [80] * 3)
    assert g.mosaic.extra.dtype == np.int64 and g.mosaic.rows.dtype == np.int64


def test_a_whole_pixel_general_list_that_shrinks_takes_crop_boxes_without_a_pre_resize():
    """A vertical flip and a resize to a quarter: whole-pixel boxes, so the crop+resize path (which
    antialiases on its own) takes them; no pre-resize is drawn beside them."""
    steps = compile_plan([RandomVerticalFlip(1.0), Resize((10, 15))]).steps
    g = draw_maps(steps, 0, 0, [0, 1], [40, 40], [60, 60])
    assert g.fast is not None and g.shrink is None
    boxes, hflips, vflips = g.fast
    assert boxes.tolist() == [[0, 0, 40, 60]] * 2 and not hflips.any() and vflips.all()


def test_the_pixel_sources_sizes_are_whole_numbers_on_every_path():
    for steps in ([RandomResizedCrop(16)], [RandomVerticalFlip(), Resize((16, 16))], [RandomAffine(10)]):
        g = draw_maps(compile_plan(steps).steps, 0, 0, [0, 1], [40, 40], [60, 60])
        assert g.source_hw.dtype == np.int64 and g.source_hw.tolist() == [[40, 60]] * 2
