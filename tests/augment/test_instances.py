"""The one target carrier: a batch's objects moved together through each sample's map, one mover per kind."""

from __future__ import annotations

import numpy as np
import pytest
from carrierkit import move_boxes, move_points

from cachekit.augment.maps import MapDraws
from cachekit.augment.plan import compile_plan
from cachekit.augment.transforms import RandomHorizontalFlip, RandomResizedCrop, Resize
from cachekit.image.geometry import Affine
from cachekit.image.instances import Instances, from_pixel_indices, move_mask

FLIP_IDX = [1, 0, 2]  # left, right, centre


def _maps(*matrices, out=(100, 200)) -> MapDraws:
    m = np.stack([np.asarray(x, dtype=np.float64) for x in matrices])
    return MapDraws(m, np.zeros((len(m), 2), np.int64), out)


def _shift(dx=0.0, dy=0.0, sx=1.0, sy=1.0):
    return [[sx, 0, dx], [0, sy, dy], [0, 0, 1]]


def _objects(owner, points=True) -> Instances:
    n = len(owner)
    boxes = np.array([[10 + i, 20, 30 + i, 40] for i in range(n)], np.float32)
    p = np.zeros((n, 3, 3), np.float32)
    p[:, :, 0] = [[12, 28, 20]] * n  # left, right, centre
    p[:, :, 1] = 30
    p[:, :, 2] = 2
    return Instances(
        boxes,
        np.arange(n) + 100,
        np.arange(n) % 2,
        np.asarray(owner, np.int64),
        (("keypoints", p, FLIP_IDX),) if points else (),
    )


def test_select_takes_every_part_of_each_object():
    objects = _objects([0, 1, 1])
    kept = objects.select(np.array([True, False, True]))
    assert len(kept) == 2 and kept.boxes[:, 0].tolist() == [10, 12]
    assert kept.classes.tolist() == [100, 102] and kept.iscrowd.tolist() == [0, 0] and kept.owner.tolist() == [0, 1]
    assert kept.points[0][0] == "keypoints" and kept.points[0][2] == FLIP_IDX and kept.points[0][1].shape == (2, 3, 3)


def test_objects_move_through_their_own_samples_map_scaled_and_shifted():
    g = _maps(_shift(5, -3), _shift(0, 0, 2, 0.5))
    moved = g.move_instances(_objects([1, 0]), 0.0)
    # sorted by sample: object 1 (of sample 0) first
    assert moved.owner.tolist() == [0, 1] and moved.classes.tolist() == [101, 100]
    assert moved.boxes.dtype == np.float32
    assert moved.boxes.tolist() == [[16, 17, 36, 37], [20, 10, 60, 20]]
    points = moved.points[0][1]
    assert points.dtype == np.float32
    assert points[0, :, :2].tolist() == [[17, 27], [33, 27], [25, 27]]
    assert points[1, :, :2].tolist() == [[24, 15], [56, 15], [40, 15]]
    assert (points[..., 2] == 2).all()  # all inside: visibility kept


def test_a_box_keeping_too_little_is_dropped_with_its_labels_and_keypoints():
    # box 0 keeps 10 of its 20 px width (0.5), box 1 all of it: 200 px wide output
    objects = Instances(
        np.array([[190, 0, 210, 10], [0, 0, 20, 10]], np.float32),
        np.array([7, 8]),
        np.array([1, 0]),
        np.array([0, 0]),
        (("keypoints", np.ones((2, 3, 3), np.float32), FLIP_IDX),),
    )
    g = _maps(_shift())
    assert len(g.move_instances(objects, 0.5)) == 2  # exactly the share asked for: kept
    kept = g.move_instances(objects, 0.51)
    assert kept.classes.tolist() == [8] and kept.iscrowd.tolist() == [0] and kept.points[0][1].shape == (1, 3, 3)
    clipped = g.move_instances(objects, 0.0)
    assert clipped.boxes[0].tolist() == [190, 0, 200, 10]  # clipped to the output


def test_a_box_moved_wholly_outside_is_dropped_even_with_no_min_visibility():
    kept = _maps(_shift(-500)).move_instances(_objects([0, 0]), 0.0)
    assert len(kept) == 0 and kept.points[0][1].shape == (0, 3, 3)


def test_points_outside_the_output_get_visibility_zero_and_are_clipped():
    p = np.array([[[-5, 10, 2], [50, 50, 1], [250, 120, 2]]], np.float32)
    moved = move_points(p, np.array([0]), _maps(_shift()))
    assert moved[0].tolist() == [[0, 10, 0], [50, 50, 1], [200, 100, 0]]


def test_a_mirror_swaps_left_and_right_by_flip_idx_and_only_a_mirror():
    p = np.array([[[10, 5, 2], [30, 5, 1], [20, 5, 2]]], np.float32)
    hflip = _maps([[-1, 0, 200], [0, 1, 0], [0, 0, 1]])
    moved = move_points(p, np.array([0]), hflip, FLIP_IDX)
    # the left point (10) lands at 190 and becomes the right one; the right (30 -> 170) the left one
    assert moved[0].tolist() == [[170, 5, 1], [190, 5, 2], [180, 5, 2]]
    vflip = _maps([[1, 0, 0], [0, -1, 100], [0, 0, 1]])
    assert move_points(p, np.array([0]), vflip, FLIP_IDX)[0, :, 0].tolist() == [30, 10, 20]
    both = _maps([[-1, 0, 200], [0, -1, 100], [0, 0, 1]])  # a half turn mirrors nothing
    assert move_points(p, np.array([0]), both, FLIP_IDX)[0, :, 0].tolist() == [190, 170, 180]
    assert move_points(p, np.array([0]), hflip, None)[0, :, 0].tolist() == [190, 170, 180]  # no flip_idx


def test_a_point_past_a_perspective_horizon_is_not_visible():
    m = [[1, 0, 0], [0, 1, 0], [-0.01, 0, 1]]  # w = 1 - x / 100: the horizon at x = 100
    p = np.array([[[50, 10, 2], [150, 10, 2], [20, 10, 2]]], np.float32)
    moved = move_points(p, np.array([0]), _maps(m))
    assert moved[0, :, 2].tolist() == [2, 0, 2]
    assert moved[0, 0, :2].tolist() == [100, 20]  # divided through: (50, 10) / 0.5
    boxes, keep, _ = move_boxes(np.array([[40, 0, 160, 20]]), np.array([0]), _maps(m), 0.0)
    assert not keep[0]  # a box with a corner past the horizon frames nothing


def test_objects_of_the_same_sample_keep_their_order_after_those_of_earlier_samples():
    g = _maps(_shift(), _shift(), _shift())
    moved = g.move_instances(_objects([2, 0, 2, 1, 0]), 0.0)
    assert moved.owner.tolist() == [0, 0, 1, 2, 2]
    assert moved.classes.tolist() == [101, 104, 103, 100, 102]
    assert moved.spans(3) == [(0, 2), (2, 3), (3, 5)]
    assert moved.spans(4) == [(0, 2), (2, 3), (3, 5), (5, 5)]


def _staged(objects, maps, out_hw, min_visibility):
    """Through a stage's maps, drawn as ``warpAffine``'s maps of pixel indices (converted once)."""
    return objects.through_each([from_pixel_indices(m) for m in maps], out_hw, min_visibility)


def test_the_stage_maps_move_boxes_and_points_in_pixel_indices_and_drop_together():
    objects = _objects([0, 0, 0])
    assert objects.through_each([], (100, 200), 0.5) is objects  # no map: as they were
    right = np.array([[1.0, 0, 170], [0, 1, 0]])  # 170 px right in pixel indices: 0.5 px either way cancels
    staged = _staged(objects, [right], (100, 200), 0.5)
    # boxes 10-30, 11-31, 12-32 go to 180-200, 181-201, 182-202 of a 200 px row: 20, 19 and 18 px of 20 stay
    assert staged.classes.tolist() == [100, 101, 102] and staged.boxes[:, 2].tolist() == [200, 200, 200]
    twice = _staged(objects, [right, np.array([[1.0, 0, 1], [0, 1, 0]])], (100, 200), 0.5)
    # a second px right, of the boxes the first one clipped at 200: each keeps all but 1 px
    assert twice.boxes[:, 0].tolist() == [181, 182, 183]
    dropped = _staged(objects, [np.array([[1.0, 0, 175], [0, 1, 0]])], (100, 200), 0.5)
    # 175 px right: 15, 14 and 13 px of 20 stay (0.75, 0.7, 0.65): all kept at 0.5; at 0.7 the last one
    # goes, with its label and points
    assert len(dropped) == 3
    strict = _staged(objects, [np.array([[1.0, 0, 175], [0, 1, 0]])], (100, 200), 0.7)
    assert strict.classes.tolist() == [100, 101] and strict.points[0][1].shape == (2, 3, 3)
    assert strict.points[0][1][:, :, 0].tolist() == [[187, 200, 195], [187, 200, 195]]
    assert strict.points[0][1][:, :, 2].tolist() == [[2, 0, 2], [2, 0, 2]]  # 203: outside
    mirror = _staged(objects, [np.array([[-1.0, 0, 199], [0, 1, 0]])], (100, 200), 0.0)
    assert mirror.points[0][1][0, :, 0].tolist() == [172, 188, 180]  # swapped by flip_idx


def test_a_mask_moves_nearest_by_affine_or_by_map_zero_outside():
    mask = (np.arange(4 * 6).reshape(4, 6) % 7 + 1).astype(np.uint8)
    shifted = np.zeros_like(mask)
    shifted[:, 2:] = mask[:, :-2]
    for where in (Affine(1.0, 1.0, 2.0, 0.0), np.array(_shift(2))):
        assert np.array_equal(move_mask(mask, where, (4, 6)), shifted)
    out = np.full((8, 12), 9, np.uint8)
    doubled = move_mask(mask, Affine(2.0, 2.0), (8, 12), out)
    assert doubled is out and np.array_equal(out, mask.repeat(2, 0).repeat(2, 1))
    mirrored = move_mask(mask, np.array([[-1.0, 0, 6], [0, 1, 0], [0, 0, 1]]), (4, 6))
    assert np.array_equal(mirrored, mask[:, ::-1])


def test_an_affine_is_the_one_convention_s_3x3_map():
    assert Affine(2.0, 0.5, 3.0, -1.0).as_matrix().tolist() == [[2, 0, 3], [0, 0.5, -1], [0, 0, 1]]
    # a warpAffine map of pixel indices, as the continuous map that moves the same pixel centres
    shift = from_pixel_indices(np.array([[1.0, 0, 2], [0, 1, 0]]))
    assert shift.tolist() == [[1, 0, 2], [0, 1, 0], [0, 0, 1]]
    half = from_pixel_indices(np.array([[0.5, 0, 0], [0, 0.5, 0]]))  # centre 0.5 of pixel 0 -> 0.25 -> index 0
    assert np.allclose(half, [[0.5, 0, 0.25], [0, 0.5, 0.25], [0, 0, 1]])


@pytest.mark.parametrize(
    "steps", [[RandomResizedCrop(24), RandomHorizontalFlip()], [Resize((40, 30)), RandomHorizontalFlip(1.0)]]
)
def test_the_crop_paths_maps_move_objects_as_each_samples_affine(steps):
    """On the crop+resize path the carrier takes each sample's ``affine`` as its 3x3 map: boxes and
    points land where that affine sends them, a mirror swaps them."""
    n = 12
    plan = compile_plan(steps)
    draws = plan.draw(4, 1, np.arange(n), np.full(n, 50), np.full(n, 70))
    objects = _objects(list(range(n)))
    moved = draws.geometry().move_instances(objects, 0.0)
    for k, j in enumerate(moved.owner.tolist()):
        a = draws.affine(j)
        i = int(np.flatnonzero(objects.classes == moved.classes[k])[0])
        x = np.sort(objects.boxes[i, [0, 2]] * a.sx + a.tx).clip(0, draws.out_size[1])
        assert np.allclose(moved.boxes[k, [0, 2]], x, atol=1e-4)
        px = objects.points[0][1][i, :, 0] * a.sx + a.tx
        if a.sx < 0:
            px = px[FLIP_IDX]
        assert np.allclose(moved.points[0][1][k, :, 0], px.clip(0, draws.out_size[1]), atol=1e-4)
    if steps[-1].p == 1.0:
        assert draws.flips.all()


def test_on_the_crop_path_a_box_just_past_the_edge_is_dropped_not_kept_zero_wide():
    """A stored box may reach a pixel past its image (``[W, y0, W + 1, y1]``): resized from 94 to 48
    columns its left edge lands at 47.99999999999999, clipped to a sliver of 1e-14 px that is 0 px
    wide once float32; the general maps dropped it, and now the crop path does too."""
    draws = compile_plan([Resize((48, 48))], min_visibility=0.0).draw(0, 0, [0], [60], [94])
    assert draws.general is None and draws.out_size == (48, 48)
    objects = Instances(
        np.array([[94, 10, 95, 20], [40, 10, 94, 20]], np.float32), np.array([3, 4]), np.zeros(2), np.zeros(2, np.int64)
    )
    moved = draws.geometry().move_instances(objects, 0.0)
    assert moved.classes.tolist() == [4]
    assert (moved.boxes[:, 2] > moved.boxes[:, 0]).all()


def test_the_stage_maps_move_a_mask_in_place_in_order_zero_where_uncovered():
    mask = (np.arange(4 * 6).reshape(4, 6) % 7 + 1).astype(np.uint8)
    row = mask.copy()
    for m in (np.array([[1.0, 0, 2], [0, 1, 0]]), np.array([[1.0, 0, 0], [0, 1, 1]])):
        row[...] = move_mask(row, from_pixel_indices(m), (4, 6))
    want = np.zeros_like(mask)
    want[1:, 2:] = mask[:-1, :-2]  # 2 px right, then 1 px down
    assert np.array_equal(row, want)
    assert np.array_equal(move_mask(mask, np.eye(3), (4, 6)), mask)
