"""A batch's targets, piece by piece, on shard columns packed by the field kinds as a build packs them:
which values are checked (and once a shard with a memo), where each boundary of a stored value lies,
how boxes, masks and the other fields come out per sample and collated, and Ultralytics' rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cachekit import CacheError
from cachekit.feed import targets as T
from cachekit.feed.batchtargets import BatchTargets, read_fields, read_objects
from cachekit.image.geometry import Affine
from cachekit.image.instances import move_mask
from cachekit.store.fields import FieldSpec
from cachekit.store.fields.mask import encode_mask

H, W = 40, 72  # every image of these shards: not square, so height and width cannot stand in for each other
BOXES = FieldSpec("boxes", {})
TAGS = FieldSpec("labels", {})
TEXT = FieldSpec("text", {})
VEC = FieldSpec("array", {"dtype": "<f4", "shape": [2]})
SEQ = FieldSpec("array", {"dtype": "<i4", "shape": [None]})


def _box(boxes, classes, crowd):
    return {
        "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
        "classes": np.asarray(classes, np.int64),
        "iscrowd": np.asarray(crowd, np.uint8),
    }


SAMPLES = [
    {"boxes": _box([[1, 2, 10, 20], [30, 5, 70, 39]], [0, 2], [0, 1]), "tags": [2, 0], "text": "a",
     "vec": [1.5, -2], "seq": [1, 2, 3]},
    {"boxes": _box([], [], []), "tags": [], "text": "", "vec": [0, 0], "seq": []},
    {"boxes": _box([[0, 0, W, H]], [1], [0]), "tags": [1], "text": "c ✓", "vec": [3, 4], "seq": [7]},
    {"boxes": _box([[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]], [2, 1, 0], [0, 0, 1]), "tags": [0],
     "text": "dd", "vec": [5, 6], "seq": [8, 9]},
]  # fmt: skip
FIELDS = {"text": TEXT, "boxes": BOXES, "tags": TAGS, "vec": VEC, "seq": SEQ}  # a boxes field after another


class Shard:
    """The columns of one shard of ``samples`` (as a build packs them) and a reader that logs its reads."""

    def __init__(self, fields, samples, labels=None):
        self.cols = {"image_shape": np.array([[3, H, W]] * len(samples), dtype="<i4")}
        self.cols["labels"] = np.asarray(labels if labels is not None else [0] * len(samples), np.int64)
        for name, spec in fields.items():
            self.cols.update(spec.handler.pack(name, spec.params, [s[name] for s in samples]))
        self.asked: list[str] = []
        self.samples = len(samples)

    def column(self, name, index):
        self.asked.append(name)
        return self.cols[name][index]


def _damaged(change, fields=None):
    samples = [dict(s, boxes={k: v.copy() for k, v in s["boxes"].items()}) for s in SAMPLES]
    change(samples)
    return Shard(fields or FIELDS, samples)


def _equal(a, b):
    return np.array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("memo", [None, dict], ids=["no memo", "memo"])
def test_read_values_gives_every_field_of_the_rows_asked(memo):
    memo = memo and memo()  # a memo of its own, not one shared by every case
    shard = Shard(FIELDS, SAMPLES)
    rows = [3, 0, 1, 3]
    got = T.read_values(FIELDS, shard.column, rows, shard.samples, 3, memo, shape=[3, None, None])
    assert [list(v) for v in got] == [list(FIELDS)] * 4
    for v, r in zip(got, rows):
        want = SAMPLES[r]
        assert v["text"] == want["text"] and v["tags"].tolist() == sorted(want["tags"])
        assert _equal(v["vec"], np.float32(want["vec"])) and v["seq"].tolist() == want["seq"]
        assert all(_equal(v["boxes"][k], want["boxes"][k]) for k in ("boxes", "classes", "iscrowd"))
    assert T.read_values(FIELDS, shard.column, [], shard.samples, 3, None, shape=[3, None, None]) == []


def test_with_a_memo_a_shard_is_read_and_checked_once():
    shard = Shard(FIELDS, SAMPLES)
    memo: dict = {}
    for rows in ([0, 2], [3], [1, 0]):
        T.read_values(FIELDS, shard.column, rows, shard.samples, 3, memo, shape=[3, None, None])
    rows_read = {"vec", "seq__shapes"}  # read by the array kind at each call, not kept
    once = sorted(set(shard.asked) - rows_read)
    assert sorted(n for n in shard.asked if n not in rows_read) == once  # each other column read once
    assert "image_shape" in once
    labels = Shard({}, SAMPLES, labels=[0, 1, -1, 2])
    for _ in range(3):
        T.check_labels(labels.column, 4, 3, memo)
    assert labels.asked == ["labels"]
    T.check_labels(labels.column, 4, 3, None)  # no memo: read again, nothing to remember it in
    assert labels.asked == ["labels", "labels"]


def test_without_a_memo_only_the_rows_read_are_checked():
    def far(samples):
        samples[3]["boxes"]["boxes"][1] = [9, 10, 11, H + 5]

    shard = _damaged(far)
    shape = [3, None, None]
    got = T.read_values(FIELDS, shard.column, [0, 2], shard.samples, 3, None, shape=shape)
    assert [v["text"] for v in got] == ["a", "c ✓"]
    with pytest.raises(
        CacheError, match=r"field 'boxes'.*a box \[9\.0, 10\.0, 11\.0, 45\.0\] outside its 72x40"
    ):
        T.read_values(FIELDS, shard.column, [3], shard.samples, 3, None, shape=shape)
    with pytest.raises(CacheError, match="outside its 72x40"):  # with a memo: the whole shard, once
        T.read_values(FIELDS, shard.column, [0], shard.samples, 3, {}, shape=shape)


def _set(path, value):
    field, part, i, j = path

    def change(samples):
        if field == "tags":
            samples[i]["tags"] = value
        else:
            samples[i][field][part][j] = value

    return change


REFUSED = {
    "a box class equal to the classes": (_set(("boxes", "classes", 3, 1, ), 3), "a class past the 3 classes"),
    "a negative box class": (_set(("boxes", "classes", 0, 0), -1), "a class past the 3 classes"),
    "a tag equal to the classes": (_set(("tags", None, 2, None), [3]), "field 'tags'.*a class past the 3"),
    "a box that is NaN": (_set(("boxes", "boxes", 3, 2), [13, np.nan, 15, 16]), r"\(a box that is not finite\)"),
    "a crowd flag of 2": (_set(("boxes", "iscrowd", 3, 0), 2), "an iscrowd flag of 2, not 0 or 1"),
    "x1 past -1": (_set(("boxes", "boxes", 3, 1), [-1.5, 10, 11, 12]), r"\[-1\.5, 10\.0, 11\.0, 12\.0\] outside its 72x40"),
    "y1 past -1": (_set(("boxes", "boxes", 3, 1), [9, -1.5, 11, 12]), r"\[9\.0, -1\.5, 11\.0, 12\.0\] outside"),
    "x2 past the width + 1": (_set(("boxes", "boxes", 3, 1), [9, 10, W + 1.5, 12]), r"\[9\.0, 10\.0, 73\.5, 12\.0\] outside"),
    "y2 past the height + 1": (_set(("boxes", "boxes", 3, 1), [9, 10, 11, H + 1.5]), r"\[9\.0, 10\.0, 11\.0, 41\.5\] outside"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("memo", [None, dict], ids=["no memo", "memo"])
def test_each_bound_of_a_stored_value_is_refused_just_past_it(case, memo):
    memo = memo and memo()
    change, words = REFUSED[case]
    shard = _damaged(change)
    for _ in range(2):  # a failed check is never remembered as passed
        with pytest.raises(CacheError, match=words):
            T.read_values(FIELDS, shard.column, [0, 1, 2, 3], shard.samples, 3, memo, shape=[3, None, None])
    with pytest.raises(CacheError, match=words):  # a fixed sample shape gives the same bounds
        T.read_values(FIELDS, shard.column, [0, 1, 2, 3], shard.samples, 3, None, shape=[3, H, W])


ACCEPTED = {
    "x1 and y1 at -1, x2 at the width + 1, y2 at the height + 1": [-1, -1, W + 1, H + 1],
    "y2 past the width is past no bound of a box of this height": [0, 0, 10, H],
}


@pytest.mark.parametrize("box", list(ACCEPTED.values()), ids=list(ACCEPTED))
def test_values_on_each_bound_are_kept(box):
    def change(samples):
        samples[3]["boxes"]["boxes"][1] = box
        samples[0]["boxes"]["iscrowd"][:] = 1  # a crowd flag of 1 is a flag
        samples[2]["boxes"]["classes"][0] = 2  # the last class

    shard = _damaged(change)
    for shape in ([3, None, None], [3, H, W], None):  # no shape: no bounds of an image to check
        got = T.read_values(FIELDS, shard.column, [3, 0, 2], shard.samples, 3, None, shape=shape)
        assert got[0]["boxes"]["boxes"][1].tolist() == box and got[1]["boxes"]["iscrowd"].tolist() == [1, 1]


def test_a_box_past_the_image_is_not_checked_without_the_cache_shape():
    shard = _damaged(_set(("boxes", "boxes", 3, 1), [9, 10, 11, 400]))
    assert len(T.read_values(FIELDS, shard.column, [3], shard.samples, 3, None)[0]["boxes"]["boxes"]) == 3
    assert len(T.read_values(FIELDS, shard.column, [3], shard.samples, None, None)[0]["boxes"]["boxes"]) == 3


@pytest.mark.parametrize("bad", [-2, 3])
def test_a_stored_image_class_just_past_either_end_is_refused(bad):
    shard = Shard({}, SAMPLES, labels=[0, -1, 2, bad])
    for memo in (None, {}):
        with pytest.raises(CacheError, match=rf"out of range \({bad}, the cache has 3 classes\)"):
            T.check_labels(shard.column, 4, 3, memo)
        assert not memo
    T.check_labels(Shard({}, SAMPLES, labels=[0, -1, 2, 1]).column, 4, 3, None)


class _Mover:
    """Draws that move a batch's objects (``MapDraws.move_instances``): each box shifted right by its
    sample's place, the objects of sample 1 dropped; records the ``min_visibility`` it was asked for."""

    def __init__(self):
        self.seen = []

    def move_instances(self, instances, min_visibility):
        self.seen.append(min_visibility)
        owner = instances.owner
        shifted = dataclasses.replace(instances, boxes=instances.boxes + owner[:, None].astype(np.float32))
        return shifted.select(owner != 1)


def _targets(fields, groups, n, classes, mover=None, shape=None) -> list[dict]:
    """A batch's targets as ``assemble`` reads them (objects flat, other fields per sample), moved by
    ``mover`` when given, as per-sample dicts."""
    others = [k for k in {s.kind for s in fields.values()} if k not in ("boxes", "keypoints", "mask")]
    objects = read_objects(fields, groups, classes, shape)
    if mover is not None:
        objects = {name: mover.move_instances(found, 0.0) for name, found in objects.items()}
    return BatchTargets(fields, objects, others=read_fields(fields, others, groups, n, classes, shape)).dicts()


@pytest.mark.parametrize("memo", [None, dict], ids=["no memo", "memo"])
def test_batch_targets_are_each_samples_values_in_the_fields_order(memo):
    fields = {"text": TEXT, "boxes": BOXES, "tags": TAGS, "seq": SEQ}
    a, b = Shard(fields, SAMPLES), Shard(fields, SAMPLES[::-1])  # two shards of one batch
    want = [SAMPLES[3], SAMPLES[3], SAMPLES[0], SAMPLES[1], SAMPLES[1]]  # b's row 0 is SAMPLES[3], row 2 [1]
    groups = [
        (np.array([0, 2, 4]), a.column, [3, 0, 1], a.samples, memo and memo()),
        (np.array([1, 3]), b.column, [0, 2], b.samples, memo and memo()),
    ]
    draws = _Mover()
    for moved in (None, draws):
        got = _targets(fields, groups, 5, 3, moved, shape=[3, None, None])
        assert [list(t) for t in got] == [["text", "boxes", "classes", "iscrowd", "tags", "seq"]] * 5
        for j, (t, w) in enumerate(zip(got, want)):
            assert (
                t["text"] == w["text"]
                and t["tags"].tolist() == sorted(w["tags"])
                and t["seq"].tolist() == w["seq"]
            )
            shift = j if moved else 0
            boxes = w["boxes"]["boxes"] + shift if not (moved and j == 1) else np.zeros((0, 4), np.float32)
            assert isinstance(t["boxes"], torch.Tensor) and _equal(t["boxes"], boxes), j
            kept = slice(0, 0) if moved and j == 1 else slice(None)
            assert t["classes"].tolist() == w["boxes"]["classes"][kept].tolist()
            assert t["iscrowd"].tolist() == w["boxes"]["iscrowd"][kept].tolist()
    assert draws.seen == [0.0]
    assert _targets(fields, [], 0, 3) == []
    fresh = [(pos, column, rows, samples, memo and memo()) for pos, column, rows, samples, _ in groups]
    with pytest.raises(CacheError, match="a class past the 2 classes"):  # the boxes' classes are checked
        _targets({"boxes": BOXES}, fresh, 5, 2, shape=[3, None, None])
    fresh = [(pos, column, rows, samples, memo and memo()) for pos, column, rows, samples, _ in groups]
    with pytest.raises(CacheError, match="field 'tags'.*a class past the 2 classes"):  # and the other fields'
        _targets({"tags": TAGS}, fresh, 5, 2)


def test_a_batch_reads_a_shards_columns_once_with_its_memo():
    fields = {"text": TEXT, "boxes": BOXES, "tags": TAGS}
    shard = Shard(fields, SAMPLES)
    memo: dict = {}
    for rows in ([0, 3], [2], [1, 0, 3]):
        got = _targets(fields, [(np.arange(len(rows)), shard.column, rows, 4, memo)], len(rows), 3)
        assert [t["text"] for t in got] == [SAMPLES[r]["text"] for r in rows]
    assert sorted(shard.asked) == sorted(set(shard.asked))  # no column read twice


class _Tiles(_Mover):
    """Draws that send each sample's objects to another sample (as a mosaic's tiles go), all kept."""

    def move_instances(self, instances, min_visibility):
        moved = dataclasses.replace(instances, owner=7 - instances.owner)
        return moved.select(np.argsort(moved.owner, kind="stable"))


def test_batch_boxes_keep_each_samples_stored_order_among_many():
    def boxes(n, first):
        k = np.arange(first, first + n)  # every box of the shard its own
        return np.stack([k % 30, k % 20 + k // 600, k % 30 + 1, k % 20 + 1 + k // 600], 1)

    many = [
        {"boxes": _box(boxes(n, 100 * i), np.arange(n) % 3, np.zeros(n))}
        for i, n in enumerate([40, 0, 33, 57, 21])
    ]
    shard = Shard({"boxes": BOXES}, many)
    rows = [4, 2, 0, 3, 2, 4, 0, 3]
    pos = np.array([7, 0, 5, 2, 3, 1, 6, 4])  # the batch's places, not in the shard's order
    got = _targets({"boxes": BOXES}, [(pos, shard.column, rows, 5, {})], 8, 3)
    for p, r in zip(pos.tolist(), rows):
        assert _equal(got[p]["boxes"], many[r]["boxes"]["boxes"]) and _equal(
            got[p]["classes"], many[r]["boxes"]["classes"]
        )
    tiled = _targets({"boxes": BOXES}, [(pos, shard.column, rows, 5, {})], 8, 3, _Tiles())
    for p, r in zip(pos.tolist(), rows):  # each sample's boxes in their stored order, in the sample they went to
        assert _equal(tiled[7 - p]["boxes"], many[r]["boxes"]["boxes"])


def _mask(h=H, w=W):
    return (np.arange(h * w).reshape(h, w) % 5 + 1).astype(np.uint8)  # no 0: the fill shows


def test_a_mask_is_decoded_checked_against_its_image_and_moved_into_its_row():
    fields = {"mask": FieldSpec("mask", {}), "tags": TAGS}
    mask = _mask()
    stored = {"mask": encode_mask(mask), "tags": np.array([1])}
    target = T.sample_target(fields, stored, "shard-x row 3", (H, W))
    assert _equal(target["mask"], mask) and target["tags"].tolist() == [1]
    with pytest.raises(CacheError, match=r"shard-x row 3: a stored mask is 72x40, its image 40x72"):
        T.sample_target(fields, stored, "shard-x row 3", (W, H))
    shift = Affine(1.0, 1.0, 5.0, 0.0)  # 5 pixels right, the same size
    flip = np.array([[-1.0, 0, W], [0, 1, 0], [0, 0, 1]])  # a mirror as a 3x3 map
    moved = np.pad(mask, ((0, 0), (5, 0)))[:, :W]
    shift_map = np.array([[1.0, 0, 5], [0, 1, 0], [0, 0, 1]])  # the shift as a 3x3 map: 0 where it uncovers
    for where, want in ((shift, moved), (flip, mask[:, ::-1]), (shift_map, moved)):
        row = np.full((H, W), 9, np.uint8)  # its row of the batch's mask buffer
        assert move_mask(target["mask"], where, (H, W), row) is row and _equal(row, want)
        assert _equal(move_mask(target["mask"], where, (H, W)), want)


def test_collated_targets_stack_only_when_no_field_varies_in_size():
    fixed = {"vec": VEC, "mask": FieldSpec("mask", {}), "label": FieldSpec("label", {})}
    targets = [{"vec": np.float32([i, -i]), "mask": _mask(4, 6) * i, "label": np.int64(i)} for i in range(3)]
    buffer = torch.from_numpy(np.stack([t["mask"] for t in targets]))
    out = T.collate_targets(fixed, targets, {"mask": buffer})
    assert isinstance(out, dict) and list(out) == ["vec", "mask", "label"]
    assert (
        out["mask"] is buffer
        and out["vec"].tolist() == [[0, 0], [1, -1], [2, -2]]
        and out["label"].tolist() == [0, 1, 2]
    )
    assert T.stacked_fields(fixed, True) and not T.stacked_fields(fixed, False)
    per = T.collate_targets(fixed, targets)  # masks of their own size: per sample
    assert isinstance(per, list) and per[2]["label"].item() == 2 and isinstance(per[2]["label"], torch.Tensor)
    assert _equal(per[1]["mask"], targets[1]["mask"]) and isinstance(per[1]["vec"], torch.Tensor)
    assert T.collate_targets({"vec": VEC}, []) == {}
    assert T.collate_targets({"vec": VEC}, targets[2:])["vec"].tolist() == [[2, -2]]  # a batch of one
    assert T.stacked_fields({"vec": VEC}, False)  # no mask: nothing of its own size
    for name, spec in {"boxes": BOXES, "tags": TAGS, "text": TEXT, "seq": SEQ}.items():
        assert not T.stacked_fields({"vec": VEC, name: spec}, True), name
        got = T.collate_targets({name: spec}, [{name: v} for v in ("x", "y")] if name == "text" else
                                [{name: np.arange(k)} for k in (1, 2)])  # fmt: skip
        assert isinstance(got, list) and len(got) == 2
    assert T.collate_targets({"text": TEXT}, [{"text": "x", "n": 3}])[0] == {
        "text": "x",
        "n": torch.tensor(3),
    }


def test_yolo_rows_are_each_kept_box_over_its_image_size():
    targets = [
        {"boxes": np.float32([[10, 20, 30, 60], [0, 0, 8, 4]]), "classes": np.array([2, 1]), "iscrowd": np.array([0, 1])},
        {"boxes": np.zeros((0, 4), np.float32), "classes": np.zeros(0, np.int64), "iscrowd": np.zeros(0, np.uint8)},
        {"boxes": torch.tensor([[0.0, 0.0, 50.0, 25.0]]), "classes": torch.tensor([4]), "iscrowd": torch.tensor([0])},
    ]  # fmt: skip
    rows = T.yolo_rows({"boxes": BOXES}, targets, [(100, 200), (10, 10), (50, 100)])
    assert rows.dtype == torch.float32
    want = [[0, 2, 0.1, 0.4, 0.1, 0.4], [2, 4, 0.25, 0.25, 0.5, 0.5]]  # cx, w over 200; cy, h over 100
    assert torch.allclose(rows, torch.tensor(want), atol=1e-6, rtol=0)
    named = [{"cars": t["boxes"], "cars_classes": t["classes"]} for t in targets]  # no crowd flags: all kept
    rows = T.yolo_rows({"text": TEXT, "cars": BOXES}, named, [(100, 200), (10, 10), (50, 100)])
    assert rows[:, :2].tolist() == [[0, 2], [0, 1], [2, 4]]
    assert torch.allclose(rows[1, 2:], torch.tensor([0.02, 0.02, 0.04, 0.04]), atol=1e-6, rtol=0)
    assert T.yolo_rows({"boxes": BOXES}, targets[1:2], [(10, 10)]).shape == (0, 6)
    with pytest.raises(
        ValueError, match=r'^collate="yolo" needs a cache with one boxes field \(--annotations\)$'
    ):
        T.yolo_rows({"a": BOXES, "b": BOXES}, targets, [(1, 1)] * 3)


def test_yolo_collate_is_refused_without_boxes_or_with_a_field_it_would_drop():
    T.check_yolo_collate({"boxes": BOXES, "label": FieldSpec("label", {})})
    with pytest.raises(
        ValueError, match=r'^collate="yolo" needs a cache with boxes \(cachekit build --annotations\)$'
    ):
        T.check_yolo_collate({"tags": TAGS})
    with pytest.raises(
        ValueError, match=r"also has tags \(labels\), text \(text\), which it would drop.*without them$"
    ):
        T.check_yolo_collate({"tags": TAGS, "boxes": BOXES, "text": TEXT})
