"""The target carrier at its edges: a mosaic's tiles, an IoU crop's rule, general maps, empty batches, many objects."""

from __future__ import annotations

import numpy as np
from carrierkit import move_boxes, move_points

from cachekit.augment.maps import MapDraws
from cachekit.augment.mosaic import MosaicDraws
from cachekit.image.instances import Instances, from_pixel_indices

FLIP_IDX = [1, 0, 2]


def _m(dx=0.0, dy=0.0, s=1.0):
    return np.array([[s, 0, dx], [0, s, dy], [0, 0, 1]], np.float64)


def _mosaic_geometry() -> MapDraws:
    """Two samples of 100 x 100 into 100 x 100 outputs. Sample 0 is a mosaic on a 200 px canvas (rows 2,
    3, 4 its extra images), shown at half scale; sample 1 is single, shown as it is. Tiles (each image
    100 x 100): its own shifted 20 px left (region x 0..80), row 2 halved at (100, 0) (region 100..150,
    0..50), row 3 at (0, 100), row 4 at (150, 150) (its region the 50 px square left on the canvas)."""
    tiles = np.stack(
        [np.stack([_m(-20), _m(100, 0, 0.5), _m(0, 100), _m(150, 150)]), np.stack([_m(50, 50)] * 4)]
    )
    regions = np.array(
        [[[0, 0, 80, 100], [100, 0, 150, 50], [0, 100, 100, 200], [150, 150, 200, 200]], [[0, 0, 0, 0]] * 4],
        np.float64,
    )
    mosaic = MosaicDraws(
        on=np.array([True, False]),
        extra=np.array([[5, 6, 7], [-1, -1, -1]]),
        rows=np.array([[2, 3, 4], [-1, -1, -1]]),
        tiles=tiles,
        regions=regions,
        canvas=200,
        fill=0,
    )
    return MapDraws(np.stack([_m(s=0.5), _m()]), np.full((2, 2), 100, np.int64), (100, 100), mosaic=mosaic)


def test_a_mosaics_boxes_go_through_their_tile_clipped_to_the_canvas_then_through_the_map():
    boxes = np.array(
        [
            [10, 10, 40, 30],  # row 0: half off the canvas's left edge, the rest kept whole
            [11, 11, 31, 31],  # row 2: halved onto (100, 0), in quarter pixels
            [10, 10, 90, 90],  # row 4: cut by the canvas's corner
            [60, 60, 90, 90],  # row 4: wholly off the canvas
            [10, 10, 30, 30],  # row 1: the single sample, its own map only
        ]
    )  # integers, as a shard may hold them
    owner = np.array([0, 2, 4, 4, 1])
    moved, keep, sample = move_boxes(boxes, owner, _mosaic_geometry(), 0.9)
    assert sample.tolist() == [0, 0, 0, 0, 1]
    assert keep.tolist() == [True, True, True, False, True]  # what the canvas cut off does not count
    assert moved[[0, 1, 2, 4]].tolist() == [
        [0, 5, 10, 15],
        [52.75, 2.75, 57.75, 7.75],
        [80, 80, 100, 100],
        [10, 10, 30, 30],
    ]


def test_a_mosaic_whose_last_tile_has_no_objects_still_moves_the_others():
    moved, keep, sample = move_boxes(
        np.array([[10, 10, 30, 30.0]] * 2), np.array([0, 2]), _mosaic_geometry(), 0.0
    )
    assert keep.tolist() == [True, True] and sample.tolist() == [0, 0]
    assert moved.tolist() == [[0, 5, 5, 15], [52.5, 2.5, 57.5, 7.5]]


def test_a_mosaics_points_leave_their_tiles_region_on_each_side_and_stay_on_its_edges():
    g = _mosaic_geometry()
    p = np.array(
        [
            [
                [21, 21, 2],
                [120, 20, 2],
                [20, 120, 1],
            ],  # row 2 (region 100..150 x 0..50): inside, past x1, past y1
            [[100, 100, 2], [0, 0, 2], [0, 0, 2]],  # row 2: on its region's far corner
            [
                [0, 0, 2],
                [-10, 10, 2],
                [10, -10, 1],
            ],  # row 4 (region 150..200): on its near corner, before x0, y0
        ]
    )  # integers
    out = move_points(p, np.array([2, 2, 4]), g)
    assert out[0].tolist() == [[55.25, 5.25, 2], [80, 5, 0], [55, 30, 0]]
    assert out[1, 0].tolist() == [75, 25, 2]
    assert out[2].tolist() == [[75, 75, 2], [70, 80, 0], [80, 70, 0]]
    single = move_points(np.array([[[10, 10, 2]] * 3], np.float32), np.array([1]), g)
    assert single[0, 0].tolist() == [10, 10, 2]  # not a mosaic: no tile, no region


def test_the_carrier_moves_a_mosaics_objects_in_order_each_with_its_points():
    objects = Instances(
        np.array([[10, 10, 30, 30], [60, 60, 90, 90], [11, 11, 31, 31]], np.float32),
        np.array([7, 8, 9]),
        np.array([0, 1, 0]),
        np.array([2, 4, 0]),
        (("keypoints", np.full((3, 3, 3), 20, np.float32), FLIP_IDX),),
    )
    moved = _mosaic_geometry().move_instances(objects, 0.0)
    assert moved.classes.tolist() == [7, 9] and moved.owner.tolist() == [
        0,
        0,
    ]  # the one off the canvas dropped
    assert moved.points[0][1][:, 0].tolist() == [[55, 5, 20], [0, 10, 20]]  # on its region's edge: kept


def _iou_geometry() -> MapDraws:
    """Sample 0 had an IoU crop keep [30, 20, 50, 60] of its view (its stored pixels moved 10 px right),
    then went 100 px right; sample 1 had none (NaN)."""
    keep_rects = np.array([[30, 20, 50, 60], [np.nan] * 4], np.float64)
    return MapDraws(
        np.stack([_m(100), _m()]),
        np.full((2, 2), 100, np.int64),
        (100, 200),
        keep_rects=keep_rects,
        keep_maps=np.stack([_m(10), _m()]),
    )


def test_an_iou_crop_keeps_the_boxes_whose_centres_are_strictly_inside_its_rect():
    boxes = np.array(
        [
            [20, 30, 40, 50],  # centre (40, 40) in the view: kept
            [15, 35, 25, 45],  # (30, 40): on the left edge
            [35, 35, 45, 45],  # (50, 40): on the right edge
            [25, 15, 35, 25],  # (40, 20): on the top edge
            [25, 55, 35, 65],  # (40, 60): on the bottom edge
            [16, 16, 26, 26],  # (31, 21): just inside
            [34, 54, 44, 64],  # (49, 59): just inside
        ],
        np.float64,
    )
    _, keep, _ = move_boxes(boxes, np.zeros(len(boxes), np.int64), _iou_geometry(), 0.0)
    assert keep.tolist() == [True, False, False, False, False, True, True]
    _, keep, _ = move_boxes(
        np.array([[0, 0, 5, 5], [150, 80, 160, 90]]), np.array([1, 1]), _iou_geometry(), 0.0
    )
    assert keep.tolist() == [True, True]  # no crop: every centre kept


def test_no_objects_move_to_no_objects():
    for g in (_mosaic_geometry(), _iou_geometry()):
        moved, keep, sample = move_boxes(np.zeros((0, 4)), [], g, 0.5)
        assert moved.shape == (0, 4) and keep.shape == (0,) and sample.shape == (0,)
        assert move_points(np.zeros((0, 3, 3)), [], g, FLIP_IDX).shape == (0, 3, 3)
        points = (("keypoints", np.zeros((0, 3, 3), np.float32), FLIP_IDX),)
        empty = Instances(
            np.zeros((0, 4), np.float32), np.zeros(0), np.zeros(0), np.zeros(0, np.int64), points
        )
        moved = g.move_instances(empty, 0.0)  # an image without boxes, of a cache with keypoints
        assert len(moved) == 0 and moved.points[0][1].shape == (0, 3, 3)


def test_objects_of_only_the_first_sample_move_in_a_batch_of_three():
    g = MapDraws(np.stack([_m(1), _m(2), _m(3)]), np.zeros((3, 2), np.int64), (100, 200))
    moved, keep, sample = move_boxes(np.array([[10, 10, 20, 20.0]]), np.array([0]), g, 0.0)
    assert moved.tolist() == [[11, 10, 21, 20]] and keep.tolist() == [True] and sample.tolist() == [0]


def test_many_objects_keep_their_order_within_each_sample():
    owner = np.arange(40) % 2
    objects = Instances(
        np.tile([[10, 10, 20, 20]], (40, 1)).astype(np.float32), np.arange(40), owner % 1, owner
    )
    moved = MapDraws(np.stack([_m(), _m()]), np.zeros((2, 2), np.int64), (100, 200)).move_instances(objects, 0.0)
    assert moved.classes.tolist() == list(range(0, 40, 2)) + list(range(1, 40, 2))


def test_a_box_clipped_below_counts_its_whole_height_and_a_sliver_at_the_bottom_is_dropped():
    g = MapDraws(_m()[None], np.zeros((1, 2), np.int64), (100, 200))
    half = np.array([[190, 20, 210, 40.0]])  # keeps 10 of its 20 px width, 20 px high from y = 20
    assert move_boxes(half, np.array([0]), g, 0.5)[1].tolist() == [True]
    assert move_boxes(half, np.array([0]), g, 0.51)[1].tolist() == [False]
    sliver = np.array([[10, np.nextafter(100.0, 0.0), 20, 120]])  # 1e-14 px of it inside, none in float32
    assert move_boxes(sliver, np.array([0]), g, 0.0)[1].tolist() == [False]


def test_points_go_through_a_rotation_and_a_perspective_in_y():
    p = np.array([[[10, 20, 2], [30, 40, 1], [50, 60, 2]]], np.float32)
    turn = MapDraws(
        np.array([[[0, -1, 100], [1, 0, 0], [0, 0, 1.0]]]), np.zeros((1, 2), np.int64), (200, 200)
    )
    assert move_points(p, np.array([0]), turn)[0].tolist() == [[80, 10, 2], [60, 30, 1], [40, 50, 2]]
    tilt = MapDraws(
        np.array([[[1, 0, 0], [0, 1, 0], [0, -0.01, 1.0]]]), np.zeros((1, 2), np.int64), (200, 200)
    )
    out = move_points(np.array([[[10, 50, 2], [10, 150, 2], [10, 0, 2]]], np.float32), np.array([0]), tilt)
    assert out[0].tolist() == [[20, 100, 2], [0, 0, 0], [10, 0, 2]]  # w = 1 - y / 100: past it at y = 150


def test_a_flattening_map_mirrors_nothing():
    p = np.array([[[10, 5, 2], [30, 5, 1], [20, 5, 2]]], np.float32)
    flat = MapDraws(np.array([[[0, 0, 5], [0, 1, 0], [0, 0, 1.0]]]), np.zeros((1, 2), np.int64), (100, 200))
    assert move_points(p, np.array([0]), flat, FLIP_IDX)[0].tolist() == [[5, 5, 2], [5, 5, 1], [5, 5, 2]]


def test_staged_objects_keep_their_owner_and_float32_points():
    objects = Instances(
        np.array([[10, 10, 20, 20]], np.float32),
        np.array([4]),
        np.array([1]),
        np.array([3]),
        (("keypoints", np.full((1, 3, 3), 15.0), FLIP_IDX),),  # float64
    )
    staged = objects.through_each([from_pixel_indices(np.array([[1.0, 0, 5], [0, 1, 0]]))], (100, 200), 0.0)
    assert staged.owner.tolist() == [3] and staged.classes.tolist() == [4] and staged.iscrowd.tolist() == [1]
    assert staged.points[0][1].dtype == np.float32 and staged.points[0][1][0, 0].tolist() == [20, 15, 15]


def test_points_given_flat_per_object_move_as_given_per_point():
    g = MapDraws(np.stack([_m(5, 0, 2)]), np.zeros((1, 2), np.int64), (100, 200))
    p = np.array([[[10, 5, 2], [30, 5, 1], [20, 5, 2]]], np.float32)
    assert np.array_equal(move_points(p.reshape(1, 9), np.array([0]), g), move_points(p, np.array([0]), g))
    assert move_points(p.reshape(1, 9), np.array([0]), g)[0, :, 0].tolist() == [25, 65, 45]
    # no objects, flat: [0, K, 3] with its K, as given per point
    assert move_points(np.zeros((0, 9), np.float32), np.zeros(0, np.int64), g).shape == (0, 3, 3)
    assert move_points(np.zeros((0, 3, 3), np.float32), np.zeros(0, np.int64), g).shape == (0, 3, 3)
