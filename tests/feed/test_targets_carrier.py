"""A sample's stored fields as the target carrier holds them and back: boxes, labels and keypoints moved together."""

from __future__ import annotations

import numpy as np
import torch

from cachekit.feed import targets as T
from cachekit.image.geometry import Affine
from cachekit.store.fields import FieldSpec

FLIP_IDX = [1, 0]
FIELDS = {
    "boxes": FieldSpec("boxes", {}),
    "kp": FieldSpec("keypoints", {"k": 2, "boxes": "boxes", "flip_idx": FLIP_IDX}),
    "other": FieldSpec("boxes", {}),
}


def _target(shift: float = 0.0, tensors: bool = False) -> dict:
    t = {
        "boxes": np.array([[10, 10, 30, 20], [60, 5, 80, 15]], np.float32) + shift,
        "classes": np.array([4, 5]),
        "iscrowd": np.array([0, 1], np.uint8),
        "kp": np.array([[[12, 12, 2], [28, 12, 1]], [[62, 8, 2], [78, 8, 2]]], np.float32) + [shift, 0, 0],
        "other": np.array([[0, 0, 5, 5]], np.float32),
        "other_classes": np.array([9]),
        "other_iscrowd": np.array([0], np.uint8),
    }
    return {k: torch.from_numpy(v) for k, v in t.items()} if tensors else t


def test_a_samples_fields_become_the_carrier_with_their_own_keypoints():
    objects = T.instances_of(FIELDS, _target(), "boxes", owner=3)
    assert len(objects) == 2 and objects.owner.tolist() == [3, 3] and objects.classes.tolist() == [4, 5]
    ((name, points, flip_idx),) = objects.points
    assert name == "kp" and points.shape == (2, 2, 3) and flip_idx == FLIP_IDX
    other = T.instances_of(FIELDS, _target(), "other")
    assert other.points == () and other.classes.tolist() == [9] and other.owner.tolist() == [0]


def test_move_target_moves_boxes_labels_and_keypoints_together_and_mirrors_them():
    mirror = Affine(-1.0, 1.0, 100.0, 0.0)  # a 100 px wide output, mirrored
    moved = T.move_target(FIELDS, _target(), mirror, (50, 100), 0.0)
    assert moved["boxes"].tolist() == [[70, 10, 90, 20], [20, 5, 40, 15]]
    # each object's left point (x 12 -> 88) is now its right one, and the other way round
    assert moved["kp"][0].tolist() == [[72, 12, 1], [88, 12, 2]]
    assert moved["classes"].tolist() == [4, 5] and moved["iscrowd"].tolist() == [0, 1]
    assert moved["other"].tolist() == [[95, 0, 100, 5]] and moved["other_classes"].tolist() == [9]
    cut = T.move_target(FIELDS, _target(), Affine(1.0, 1.0, -50.0, 0.0), (50, 100), 0.5)  # 50 px left
    # the first object leaves the output: it goes with its label, flag and keypoints; the other stays
    assert cut["classes"].tolist() == [5] and cut["iscrowd"].tolist() == [1] and cut["kp"].shape == (1, 2, 3)
    assert cut["kp"][0].tolist() == [[12, 8, 2], [28, 8, 2]] and len(cut["other"]) == 0
    kept = T.move_target(FIELDS, _target(), mirror, (50, 100), 0.0, boxes=False)
    assert kept["boxes"] is not None and np.array_equal(kept["boxes"], _target()["boxes"])


class _Stage:
    """A per-sample stage whose sample 1 is shifted 40 px left (its maps as targets take them: 3x3,
    continuous), sample 0 left as it is."""

    out_hw = (50, 100)

    def matrices(self, j):
        return [np.array([[1.0, 0, -40], [0, 1, 0], [0, 0, 1]])] if j == 1 else []


def test_the_stage_moves_each_samples_objects_in_place_keeping_tensors_tensors():
    targets = [_target(tensors=True), _target(tensors=True), _target()]
    before = targets[0]["boxes"]
    T.stage_targets(FIELDS, targets, _Stage(), 0.6)
    assert targets[0]["boxes"] is before  # no map: untouched
    moved = targets[1]
    assert isinstance(moved["boxes"], torch.Tensor) and isinstance(moved["kp"], torch.Tensor)
    # the first box (10-30) keeps nothing once 40 px left, the second (60-80) all of it
    assert moved["boxes"].tolist() == [[20, 5, 40, 15]] and moved["classes"].tolist() == [5]
    assert moved["kp"].tolist() == [[[22, 8, 2], [38, 8, 2]]] and moved["iscrowd"].tolist() == [1]
    assert len(moved["other"]) == 0 and len(moved["other_classes"]) == 0  # its only box left the image
    assert isinstance(targets[2]["boxes"], np.ndarray) and targets[2]["boxes"].tolist() == _target()["boxes"].tolist()


class _Shift:
    """Draws that shift each sample's objects right by 10 px a sample (and drop none)."""

    def move_instances(self, instances, min_visibility):
        import dataclasses

        shift = np.asarray(instances.owner, np.float32)[:, None] * 10
        points = tuple((n, p + np.concatenate([shift, 0 * shift, 0 * shift], 1)[:, None], f) for n, p, f in instances.points)
        return dataclasses.replace(instances, boxes=instances.boxes + shift * [1, 0, 1, 0], points=points)


def test_a_batch_moves_each_samples_keypoints_with_its_own_boxes():
    targets = [_target(), _target(shift=1), _target(shift=2)]
    T.move_boxes_of_batch(FIELDS, targets, _Shift(), 0.0)
    for j, t in enumerate(targets):
        assert isinstance(t["kp"], torch.Tensor) and t["kp"].shape == (2, 2, 3)
        assert t["kp"][:, :, 0].tolist() == [[12 + 11 * j, 28 + 11 * j], [62 + 11 * j, 78 + 11 * j]]
        assert t["boxes"][:, 0].tolist() == [10 + 11 * j, 60 + 11 * j]
        assert t["other"].tolist() == [[10 * j, 0, 5 + 10 * j, 5]]
