"""A batch's targets as one object (``BatchTargets``): each boxes field's objects in the carrier, moved
by the batch's work with their labels and keypoints, and made per-sample dicts once, at collate."""

from __future__ import annotations

import numpy as np
import torch

from cachekit.augment.plan import compile_plan
from cachekit.feed.batchtargets import BatchTargets
from cachekit.image.instances import Instances
from cachekit.store.fields import FieldSpec
from cachekit.transforms import MatrixOp, RandomHorizontalFlip, Resize

FLIP_IDX = [1, 0]
FIELDS = {
    "boxes": FieldSpec("boxes", {}),
    "kp": FieldSpec("keypoints", {"k": 2, "boxes": "boxes", "flip_idx": FLIP_IDX}),
    "tags": FieldSpec("labels", {}),
    "other": FieldSpec("boxes", {}),
}


def _objects(shift: float = 0.0, samples: int = 1) -> dict[str, Instances]:
    """Sample ``j`` (of ``samples``): two boxes with their keypoints, shifted ``j * shift`` right; one
    other box."""
    boxes = np.array([[10, 10, 30, 20], [60, 5, 80, 15]], np.float32)
    kp = np.array([[[12, 12, 2], [28, 12, 1]], [[62, 8, 2], [78, 8, 2]]], np.float32)
    step = np.array([1, 0, 1, 0], np.float32)
    return {
        "boxes": Instances(
            np.concatenate([boxes + j * shift * step for j in range(samples)]),
            np.tile([4, 5], samples), np.tile(np.array([0, 1], np.uint8), samples), np.repeat(np.arange(samples), 2),
            (("kp", np.concatenate([kp + [j * shift, 0, 0] for j in range(samples)]), FLIP_IDX),),
        ),
        "other": Instances(np.tile(np.array([[0, 0, 5, 5]], np.float32), (samples, 1)), np.full(samples, 9),
                           np.zeros(samples, np.uint8), np.arange(samples)),
    }  # fmt: skip


def test_each_sample_gets_its_own_objects_in_the_fields_order_once():
    targets = BatchTargets(FIELDS, _objects(shift=100.0, samples=3), others=[{"tags": np.array([j])} for j in range(3)])
    dicts = targets.dicts()
    assert targets.dicts() is dicts and list(targets) == dicts and len(targets) == 3  # made once
    for j, t in enumerate(dicts):
        assert list(t) == ["boxes", "classes", "iscrowd", "kp", "tags", "other", "other_classes", "other_iscrowd"]
        assert isinstance(t["boxes"], torch.Tensor) and t["boxes"][:, 0].tolist() == [10 + 100 * j, 60 + 100 * j]
        assert t["classes"].tolist() == [4, 5] and t["iscrowd"].tolist() == [0, 1] and t["tags"].tolist() == [j]
        assert t["kp"].shape == (2, 2, 3) and t["kp"][0, 0, 0] == 12 + 100 * j
        assert t["other"].tolist() == [[0, 0, 5, 5]] and t["other_classes"].tolist() == [9]
    masks = {"mask": torch.arange(2 * 4 * 6, dtype=torch.uint8).reshape(2, 4, 6)}
    sized = BatchTargets({"mask": FieldSpec("mask", {})}, {}, masks, [{}, {}], [(4, 6), (3, 5)])
    assert sized[1]["mask"].shape == (3, 5) and np.shares_memory(sized[1]["mask"], masks["mask"][1].numpy())


def _work(steps, n: int = 1, size=(50, 100)):
    plan = compile_plan(steps, min_visibility=0.5)
    return plan.draw_batch(0, 0, np.arange(n), np.full(n, size[0]), np.full(n, size[1]), detection=True)


def test_the_batch_work_moves_boxes_labels_and_keypoints_together_and_mirrors_them():
    moved = _work([Resize((50, 100)), RandomHorizontalFlip(1.0)]).move(_objects(), 1)
    boxes = moved["boxes"]
    assert boxes.boxes.tolist() == [[70, 10, 90, 20], [20, 5, 40, 15]]
    # each object's left point (x 12 -> 88) is now its right one, and the other way round
    assert boxes.points[0][1][0].tolist() == [[72, 12, 1], [88, 12, 2]]
    assert boxes.classes.tolist() == [4, 5] and boxes.iscrowd.tolist() == [0, 1]
    assert moved["other"].boxes.tolist() == [[95, 0, 100, 5]] and moved["other"].classes.tolist() == [9]


def _left(h, w, rng):  # 50 px left, the same size
    return np.array([[1.0, 0, -50], [0, 1, 0], [0, 0, 1]])


def test_an_object_whose_box_leaves_goes_with_its_label_flag_and_keypoints():
    cut = _work([MatrixOp(_left)]).move(_objects(), 1)["boxes"]
    assert cut.classes.tolist() == [5] and cut.iscrowd.tolist() == [1] and cut.points[0][1].shape == (1, 2, 3)
    assert cut.points[0][1][0].tolist() == [[12, 8, 2], [28, 8, 2]]
    assert len(_work([MatrixOp(_left)]).move(_objects(), 1)["other"]) == 0
