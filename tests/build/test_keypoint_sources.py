"""Keypoints from every source: COCO person keypoints, Ultralytics pose labels, samples from code.
Round trips give the source's points in the stored image's pixels (YOLO's denormalised), through a
build-time letterbox as boxes go; hostile points (NaN, another K, a visibility of 7, points
without boxes) leave their annotation, row or sample out with the reason."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build

QUIET = {"workers": 1, "progress": False, "order": "sorted"}
NAMES = ["nose", "left_eye", "right_eye", "left_wrist", "right_wrist"]
SKELETON = [[1, 2], [1, 3], [2, 4], [3, 5]]  # COCO numbers points from 1
SIZES = [(60, 100), (80, 50), (64, 64)]  # (height, width)


def _coco(tmp_path, extra_annotations=()):
    raw = tmp_path / "raw"
    raw.mkdir()
    rng = np.random.default_rng(2)
    images, annotations, truth = [], [], {}
    for i, (h, w) in enumerate(SIZES):
        cv2.imwrite(str(raw / f"{i}.png"), rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": w, "height": h})
        points = []
        for o in range(2):
            box = [5.0 + 20 * o, 4.0, 18.0, 30.0]  # x, y, w, h
            pts = np.stack(
                [rng.uniform(box[0], box[0] + box[2], 5), rng.uniform(4, 34, 5), rng.integers(0, 3, 5)], 1
            ).round(2)
            pts[pts[:, 2] == 0, :2] = 0  # COCO: an unlabelled point is (0, 0, 0)
            annotations.append(
                {"id": len(annotations) + 1, "image_id": i + 1, "category_id": 1, "bbox": box,
                 "iscrowd": 0, "keypoints": pts.reshape(-1).tolist(), "num_keypoints": int((pts[:, 2] > 0).sum())}
            )  # fmt: skip
            points.append(pts)
        truth[f"{i}.png"] = np.array(points, np.float32)
    annotations += [dict(a, id=100 + k) for k, a in enumerate(extra_annotations)]
    category = {"id": 1, "name": "person", "keypoints": NAMES, "skeleton": SKELETON}
    (tmp_path / "ann.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": [category]})
    )
    return raw, tmp_path / "ann.json", truth


def test_coco_person_keypoints_round_trip_with_names_skeleton_and_flip_idx(tmp_path):
    raw, ann, truth = _coco(tmp_path)
    build(raw, tmp_path / "c", BuildConfig(annotations=str(ann), pipeline="none", **QUIET))
    ds = CachedDataset(tmp_path / "c")
    params = ds.manifest.sample.fields["keypoints"].params
    assert params == {
        "boxes": "boxes",
        "k": 5,
        "names": NAMES,
        "skeleton": [[0, 1], [0, 2], [1, 3], [2, 4]],
        "flip_idx": [0, 2, 1, 4, 3],
    }
    for i in range(len(ds)):
        got = ds[i][1]["keypoints"].numpy()
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, truth[ds.source(i)], atol=1e-4)


def test_coco_hostile_keypoints_leave_their_annotation_out_with_the_reason(tmp_path):
    base = {"image_id": 1, "category_id": 1, "bbox": [1.0, 1.0, 10.0, 10.0], "iscrowd": 0}
    bad = [
        dict(base, keypoints=[1.0, 2.0, 7] + [0, 0, 0] * 4),
        dict(base, keypoints=[1.0, 2.0, 2] * 4),  # K = 4
        dict(base, keypoints=[float("nan"), 2.0, 2] + [0, 0, 0] * 4),
    ]
    raw, ann, truth = _coco(tmp_path, bad)
    result = build(raw, tmp_path / "c", BuildConfig(annotations=str(ann), pipeline="none", **QUIET))
    reasons = " | ".join(d["reason"] for d in result.manifest.source["dropped"])
    assert "visibility of 7" in reasons
    assert "are not 5 x [x, y, v]" in reasons
    assert "not a finite number" in reasons
    ds = CachedDataset(tmp_path / "c")
    for i in range(len(ds)):  # the good annotations are all there, as they were
        np.testing.assert_allclose(ds[i][1]["keypoints"].numpy(), truth[ds.source(i)], atol=1e-4)


def test_coco_labelled_keypoints_outside_their_image_leave_the_annotation_out(tmp_path):
    """A labelled point (v 1 or 2) outside its image is reported with its annotation, as a box outside
    is, not kept silently unlabelled at the edge; one within a pixel of the edge is clipped onto it
    and stays labelled; an unlabelled point may lie anywhere (its x and y mean nothing)."""
    base = {"image_id": 1, "category_id": 1, "bbox": [1.0, 1.0, 10.0, 10.0], "iscrowd": 0}
    h, w = SIZES[0]
    bad = [
        dict(base, keypoints=[1, 2, 2, 3, 4, 2, w + 5, 4, 2, 5, 6, 1, 7, 8, 2]),  # right of the image
        dict(base, keypoints=[1, 2, 2, 3, 4, 2, 5, 6, 2, 5, -3, 1, 7, 8, 2]),  # above it, hidden
        dict(base, keypoints=[1, 2, 2, 3, 4, 2, 5, 6, 2, -2, 6, 2, 7, 8, 2]),  # left of it
        dict(base, keypoints=[1, 2, 2, 3, 4, 2, 5, 6, 2, 7, 8, 2, 9, h + 2, 1]),  # below it
        dict(base, keypoints=[w + 0.5, 2, 2, 3, h + 0.5, 1, -0.5, 6, 2, 400, -70, 0, 7, 8, 0]),
    ]
    raw, ann, truth = _coco(tmp_path, bad)
    result = build(raw, tmp_path / "c", BuildConfig(annotations=str(ann), pipeline="none", **QUIET))
    reasons = [d["reason"] for d in result.manifest.source["dropped"]]
    assert reasons == [
        f"annotations[6]: keypoint 2 ({w + 5}, 4) lies outside its {w}x{h} image",
        "annotations[7]: keypoint 3 (5, -3) lies outside its 100x60 image",
        "annotations[8]: keypoint 3 (-2, 6) lies outside its 100x60 image",
        f"annotations[9]: keypoint 4 (9, {h + 2}) lies outside its 100x60 image",
    ]
    ds = CachedDataset(tmp_path / "c")
    points = next(ds[i][1]["keypoints"].numpy() for i in range(len(ds)) if ds.source(i) == "0.png")
    assert points.shape == (3, 5, 3)
    np.testing.assert_allclose(points[:2], truth["0.png"], atol=1e-4)
    np.testing.assert_allclose(points[2, :3], [[w, 2, 2], [3, h, 1], [0, 6, 2]])
    assert points[2, 3:, 2].tolist() == [0, 0]


def test_coco_point_names_given_twice_are_left_out_with_the_reason(tmp_path):
    """Which point a repeated name means, and its mirror's partner, would be a guess: the category's
    points are reported, not a flip_idx the user never gave refused in their place."""
    raw, ann, _ = _coco(tmp_path)
    obj = json.loads(ann.read_text())
    obj["categories"][0]["keypoints"] = ["nose", "left_eye", "right_eye", "left_wrist", "right_eye"]
    ann.write_text(json.dumps(obj))
    result = build(raw, tmp_path / "c", BuildConfig(annotations=str(ann), pipeline="none", **QUIET))
    assert {
        "where": "categories[0]",
        "reason": "'keypoints' names the point 'right_eye' twice (its objects are kept without its points)",
    } in result.manifest.source["dropped"]
    ds = CachedDataset(tmp_path / "c")
    assert "keypoints" not in ds.manifest.sample.fields and len(ds[0][1]["boxes"]) == 2


def test_coco_a_category_whose_points_differ_keeps_its_objects_without_them(tmp_path):
    """One keypoints field, one meaning per index: a category naming its K points otherwise (or
    another K) is reported once, its objects kept with unlabelled points, not stored under the first
    category's names and swapped by its flip_idx; the first category's points are as they were."""
    raw, ann, truth = _coco(tmp_path)
    obj = json.loads(ann.read_text())
    obj["categories"] += [
        {"id": 2, "name": "cat", "keypoints": ["nose", "left_ear", "right_ear", "tail", "back"]},
        {"id": 3, "name": "dog", "keypoints": ["a", "b"]},
        {"id": 4, "name": "crowd", "keypoints": [f"p{i}" for i in range(1025)]},  # past MAX_KEYPOINTS
    ]
    box = {"image_id": 1, "iscrowd": 0, "bbox": [40.0, 30.0, 10.0, 10.0]}
    obj["annotations"] += [
        dict(box, id=998, category_id=2, keypoints=[41, 31, 2, 42, 32, 2, 43, 33, 1, 44, 34, 2, 45, 35, 2]),
        dict(box, id=999, category_id=3, keypoints=[41, 31, 2, 42, 32, 2]),
    ]
    ann.write_text(json.dumps(obj))
    result = build(raw, tmp_path / "c", BuildConfig(annotations=str(ann), pipeline="none", **QUIET))
    reasons = {d["where"]: d["reason"] for d in result.manifest.source["dropped"]}
    assert reasons == {
        "categories[1]": "keypoint 1 is 'left_ear', another category's is 'left_eye' "
        "(its objects are kept without its points)",
        "categories[2]": "2 keypoints, another category has 5 (its objects are kept without its points)",
        "categories[3]": "1025 keypoints, past the 1024 a field holds (its objects are kept without its points)",
    }
    ds = CachedDataset(tmp_path / "c")
    assert ds.manifest.sample.fields["keypoints"].params["names"] == NAMES
    target = next(ds[i][1] for i in range(len(ds)) if ds.source(i) == "0.png")
    assert target["classes"].tolist() == [0, 0, 1, 2]
    np.testing.assert_allclose(target["keypoints"][:2].numpy(), truth["0.png"], atol=1e-4)
    assert target["keypoints"][2:].abs().sum() == 0


def _yolo(tmp_path, kpt_shape=(4, 3), extra_rows=""):
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "labels").mkdir()
    (raw / "data.yaml").write_text(
        f"names: [person]\nkpt_shape: [{kpt_shape[0]}, {kpt_shape[1]}]\nflip_idx: [1, 0, 3, 2]\n"
    )
    rng = np.random.default_rng(3)
    truth = {}
    for i, (h, w) in enumerate(SIZES):
        cv2.imwrite(str(raw / "images" / f"{i}.png"), rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        pts = np.stack([rng.uniform(0.1, 0.9, 4), rng.uniform(0.1, 0.9, 4), rng.integers(0, 3, 4)], 1).round(
            5
        )
        values = pts if kpt_shape[1] == 3 else pts[:, :2]
        line = "0 0.5 0.5 0.9 0.9 " + " ".join(f"{v:g}" for v in values.reshape(-1))
        (raw / "labels" / f"{i}.txt").write_text(line + "\n" + (extra_rows if i == 0 else ""))
        if kpt_shape[1] == 2:
            pts[:, 2] = 1.0  # Ultralytics: a 2-D point is labelled
        truth[f"images/{i}.png"] = (pts * [w, h, 1])[None].astype(np.float32)
    return raw, truth


@pytest.mark.parametrize("dims", [3, 2])
def test_yolo_pose_labels_round_trip_denormalised(tmp_path, dims):
    raw, truth = _yolo(tmp_path, (4, dims))
    build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    ds = CachedDataset(tmp_path / "c")
    params = ds.manifest.sample.fields["keypoints"].params
    assert params == {"boxes": "boxes", "k": 4, "flip_idx": [1, 0, 3, 2]}
    for i in range(len(ds)):
        np.testing.assert_allclose(ds[i][1]["keypoints"].numpy(), truth[ds.source(i)], rtol=1e-5, atol=1e-3)


def test_yolo_hostile_pose_rows_are_left_out_with_the_reason(tmp_path):
    rows = "0 0.5 0.5 0.2 0.2 0.1 0.1 2 0.2 0.2 7 0.3 0.3 2 0.4 0.4 2\n"  # visibility 7
    rows += "0 0.5 0.5 0.2 0.2 0.1 0.1 2 0.2 0.2 2 0.3 0.3 2\n"  # 3 points, not 4
    rows += "0 0.5 0.5 0.2 0.2 nan 0.1 2 0.2 0.2 2 0.3 0.3 2 0.4 0.4 2\n"
    raw, truth = _yolo(tmp_path, extra_rows=rows)
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    reasons = " | ".join(d["reason"] for d in result.manifest.source["dropped"])
    assert "visibility of 7" in reasons and "4 x 3 keypoint values" in reasons and "not a finite" in reasons
    ds = CachedDataset(tmp_path / "c")
    for i in range(len(ds)):
        np.testing.assert_allclose(ds[i][1]["keypoints"].numpy(), truth[ds.source(i)], rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dims", [3, 2])
def test_yolo_pose_points_outside_the_image_leave_their_row_out(tmp_path, dims):
    """Pixel coordinates where normalised ones belong: the row is reported, as a box outside its image
    is, not kept with every point silently made unlabelled at the edge. An unlabelled point may lie
    anywhere; a labelled one past the edge by rounding is clipped onto it and stays labelled."""
    v = " 2" if dims == 3 else ""
    rows = f"0 0.5 0.5 0.2 0.2 0.1 0.1{v} 0.2 0.2{v} 0.3 0.3{v} 45 12{v}\n"  # pixels
    rows += f"0 0.5 0.5 0.2 0.2 0.1 0.1{v} 0.2 1.2{v} 0.3 0.3{v} 0.4 0.4{v}\n"  # y past the bottom
    if dims == 3:
        rows += "0 0.5 0.5 0.2 0.2 0.1 0.1 2 0.2 0.2 2 0.3 0.3 2 -0.2 0.4 1\n"  # hidden, left of the image
    rows += f"0 0.4 0.4 0.2 0.2 1.008 0.1{v} 0.2 -0.0005{v} 0.3 0.3{v} {'5 -3 0' if dims == 3 else '-1 -1'}\n"
    raw, truth = _yolo(tmp_path, (4, dims), extra_rows=rows)
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    reasons = [d["reason"] for d in result.manifest.source["dropped"]]
    assert len(reasons) == 2 + (dims == 3), reasons
    assert "line 2: keypoint 3 (45, 12) lies outside the image" in reasons[0]
    assert "line 3: keypoint 1 (0.2, 1.2) lies outside the image" in reasons[1]
    if dims == 3:
        assert "line 4: keypoint 3 (-0.2, 0.4) lies outside" in reasons[2]
    ds = CachedDataset(tmp_path / "c")
    i = next(i for i in range(len(ds)) if ds.source(i) == "images/0.png")
    points = ds[i][1]["keypoints"].numpy()
    h, w = SIZES[0]
    assert points.shape == (2, 4, 3)
    np.testing.assert_allclose(points[0], truth["images/0.png"][0], rtol=1e-5, atol=1e-3)
    labelled = 2.0 if dims == 3 else 1.0
    above = labelled if dims == 3 else 0.0  # a 2-D point with a negative coordinate: unlabelled (Ultralytics)
    np.testing.assert_allclose(
        points[1, :3],
        [[w, 0.1 * h, labelled], [0.2 * w, 0, above], [0.3 * w, 0.3 * h, labelled]],
        atol=1e-3,
    )
    assert points[1, 3, 2] == 0  # unlabelled, wherever it was written


def test_yolo_pose_label_files_saved_with_a_bom_keep_their_first_row(tmp_path):
    """Windows editors start a UTF-8 file with a byte order mark: Ultralytics reads it as utf-8-sig,
    so the first row's class is "0", not "\ufeff0" (a row left out as not a number)."""
    raw, truth = _yolo(tmp_path)
    for f in (raw / "labels").iterdir():
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes().replace(b"\n", b"\r\n"))
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    assert not result.manifest.source.get("dropped")
    ds = CachedDataset(tmp_path / "c")
    for i in range(len(ds)):
        np.testing.assert_allclose(ds[i][1]["keypoints"].numpy(), truth[ds.source(i)], rtol=1e-5, atol=1e-3)


def test_a_build_time_letterbox_moves_keypoints_as_it_moves_boxes(tmp_path):
    raw, truth = _yolo(tmp_path)
    build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="letterbox-640", size=48, **QUIET))
    ds = CachedDataset(tmp_path / "c")
    for i in range(len(ds)):
        extras = ds.extras(i)
        (left, top), (sx, sy) = extras["pad"].astype(np.float64), extras["scale_xy"].astype(np.float64)
        got = ds[i][1]["keypoints"].numpy().astype(np.float64)
        want = truth[ds.source(i)].astype(np.float64)
        np.testing.assert_allclose(got[..., 0], want[..., 0] * sx + left, atol=1e-3)
        np.testing.assert_allclose(got[..., 1], want[..., 1] * sy + top, atol=1e-3)
        np.testing.assert_array_equal(got[..., 2], want[..., 2])


def test_samples_from_code_with_hostile_keypoints_are_skipped_with_the_reason(tmp_path):
    image = np.zeros((20, 30, 3), np.uint8)
    box = np.array([[1, 1, 10, 10]], np.float32)
    good = np.array([[[2, 3, 2], [4, 5, 1], [0, 0, 0]]], np.float32)
    samples = [
        (image, {"boxes": box, "classes": [0], "keypoints": good}),
        (image, {"boxes": box, "classes": [0], "keypoints": good[:, :, :2]}),  # [N, K, 2]: visible
        (image, {"boxes": box, "classes": [0], "keypoints": np.full((1, 3, 3), np.nan)}),
        (image, {"boxes": box, "classes": [0], "keypoints": np.ones((1, 4, 3))}),
        (image, {"boxes": box, "classes": [0], "keypoints": good * [1, 1, 3.5]}),
        (image, {"keypoints": good}),
        (image, {"boxes": box, "classes": [0], "keypoints": np.concatenate([good, good])}),
        (image, {"boxes": box, "classes": [0], "keypoints": np.zeros((1, 0, 3))}),  # one object, no points
    ]
    result = build(samples, tmp_path / "c", BuildConfig(pipeline="none", **QUIET), classes=1)
    reasons = [s.reason for s in result.manifest.skipped]
    assert len(reasons) == 6
    for words in ("not finite", "others have 3", "visibility of 7", "without 'boxes'", "2 objects",
                  "0 keypoints per object, the dataset's others have 3"):  # fmt: skip
        assert any(words in r for r in reasons), (words, reasons)
    ds = CachedDataset(tmp_path / "c")
    assert len(ds) == 2
    np.testing.assert_array_equal(ds[0][1]["keypoints"].numpy(), good)
    np.testing.assert_array_equal(ds[1][1]["keypoints"].numpy(), good * [1, 1, 0] + [0, 0, 2])


@pytest.mark.parametrize("normalized", [False, True])
def test_samples_from_code_with_a_labelled_point_outside_their_image_are_skipped(tmp_path, normalized):
    """A labelled point outside the image is skipped with the reason, as a box outside it is (points of
    another image, or pixels given as normalised): not kept silently unlabelled at the edge. Past
    the edge by rounding it is clipped onto it and stays labelled; an unlabelled point may lie anywhere."""
    h, w = 20, 30
    scale = np.array([w, h, 1.0]) if normalized else np.ones(3)
    image = np.zeros((h, w, 3), np.uint8)
    box = np.array([[1, 1, 10, 10]], np.float32) / (scale[[0, 1, 0, 1]] if normalized else 1)

    def sample(points):
        return (image, {"boxes": box, "classes": [0], "keypoints": np.array([points], np.float64) / scale})

    edge = 0.5 if not normalized else 0.15  # within a pixel; within 1% of the side (Ultralytics' bound)
    samples = [
        sample([[2, 3, 2], [w + edge, 5, 1], [4, -edge, 2], [500, -60, 0]]),
        sample([[2, 3, 2], [w + 2, 5, 2], [4, 6, 2], [0, 0, 0]]),  # right of it
        sample([[2, 3, 2], [4, 5, 2], [4, h + 2, 1], [0, 0, 0]]),  # below it
        sample([[2, 3, 2], [4, 5, 2], [-2, 6, 1], [0, 0, 0]]),  # left of it
        sample([[2, -2, 2], [4, 5, 2], [4, 6, 1], [0, 0, 0]]),  # above it
    ]
    result = build(
        samples, tmp_path / "c", BuildConfig(pipeline="none", **QUIET), classes=1, normalized=normalized
    )
    reasons = [s.reason for s in result.manifest.skipped]
    assert len(reasons) == 4, reasons
    for words in ("keypoint 1 of object 0 (32, 5)", "keypoint 2 of object 0 (4, 22)", "(-2, 6)", "(2, -2)"):
        assert any(f"{words}" in r and "outside its 30x20 image" in r for r in reasons), (words, reasons)
    got = CachedDataset(tmp_path / "c")[0][1]["keypoints"].numpy()
    np.testing.assert_allclose(got[0, :3], [[2, 3, 2], [w, 5, 1], [4, 0, 2]], atol=1e-4)
    assert got[0, 3, 2] == 0


def test_parquet_objects_with_keypoints_round_trip(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(4)
    rows, truth = [], []
    for i in range(4):
        image = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
        ok, png = cv2.imencode(".png", image)
        n = i % 3
        boxes = [[2.0 + 10 * o, 3.0, 9.0 + 10 * o, 20.0] for o in range(n)]
        points = rng.uniform(3, 19, (n, 3, 2)).round(3)
        points = np.concatenate([points, rng.integers(0, 3, (n, 3, 1))], 2)
        rows.append(
            {"image": {"bytes": png.tobytes(), "path": f"{i}.png"},
             "objects": {"bbox": boxes, "category": [0] * n, "keypoints": points.tolist()}}
        )  # fmt: skip
        truth.append(points.astype(np.float32).reshape(n, 3, 3))
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "train-00000.parquet")
    build(str(tmp_path / "pq" / "*.parquet"), tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    ds = CachedDataset(tmp_path / "c")
    assert ds.manifest.sample.fields["keypoints"].params == {"boxes": "boxes", "k": 3}
    got = sorted((ds[i][1]["keypoints"].numpy() for i in range(len(ds))), key=lambda a: (len(a), a.sum()))
    want = sorted(truth, key=lambda a: (len(a), a.sum()))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-4)


def test_a_build_time_crop_that_drops_a_box_drops_its_keypoints(tmp_path):
    """classification-224 at size 28 on a 40 x 120 image: shorter side to 32 (x 0.8), centre crop
    28: the object on the left is cut away with its points, the one in the middle kept and moved."""
    image = np.zeros((40, 120, 3), np.uint8)
    boxes = np.array([[2, 5, 30, 35], [50, 5, 70, 35]], np.float32)
    points = np.array([[[10, 10, 2], [20, 30, 2]], [[55, 10, 2], [65, 30, 1]]], np.float32)
    sample = (image, {"boxes": boxes, "classes": [0, 1], "keypoints": points})
    build([sample], tmp_path / "c", BuildConfig(pipeline="classification-224", size=28, **QUIET), classes=2)
    target = CachedDataset(tmp_path / "c")[0][1]
    assert target["classes"].tolist() == [1]
    got = target["keypoints"].numpy()
    assert got.shape == (1, 2, 3)
    np.testing.assert_allclose(got[0, :, 0], points[1, :, 0] * 0.8 - 34, atol=0.1)
    np.testing.assert_allclose(got[0, :, 1], points[1, :, 1] * 0.8 - 2, atol=0.1)
    np.testing.assert_array_equal(got[0, :, 2], [2, 1])


def test_webdataset_json_targets_with_keypoints_round_trip(tmp_path):
    import io
    import tarfile

    rng = np.random.default_rng(6)
    truth = {}
    with tarfile.open(tmp_path / "train-000000.tar", "w") as tar:
        for i in range(3):
            ok, png = cv2.imencode(".png", rng.integers(0, 256, (24, 32, 3), dtype=np.uint8))
            points = np.concatenate([rng.uniform(2, 20, (1, 4, 2)).round(2), np.full((1, 4, 1), 2.0)], 2)
            target = {"boxes": [[1.0, 1.0, 22.0, 22.0]], "classes": [0], "keypoints": points.tolist()}
            truth[i] = points.astype(np.float32)
            for name, data in (
                (f"{i:04d}.png", png.tobytes()),
                (f"{i:04d}.json", json.dumps(target).encode()),
            ):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    build(str(tmp_path / "train-000000.tar"), tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    ds = CachedDataset(tmp_path / "c")
    assert ds.manifest.sample.fields["keypoints"].params == {"boxes": "boxes", "k": 4}
    for i in range(len(ds)):
        key = int(ds.source(i).rsplit("/", 1)[-1].split(".")[0])
        np.testing.assert_allclose(ds[i][1]["keypoints"].numpy(), truth[key], atol=1e-4)


def test_coco_objects_of_a_category_without_points_get_unlabelled_ones(tmp_path):
    raw, ann, truth = _coco(tmp_path)
    obj = json.loads(ann.read_text())
    obj["categories"] += [
        {"id": 2, "name": "ball"},  # no keypoints: its objects' points are all unlabelled
        {"id": 3, "name": "dog", "keypoints": ["a", "b"]},  # another K: left out, with the reason
    ]
    obj["annotations"].append(
        {"id": 999, "image_id": 1, "category_id": 2, "bbox": [40.0, 40.0, 10.0, 10.0], "iscrowd": 0}
    )
    ann.write_text(json.dumps(obj))
    result = build(raw, tmp_path / "c", BuildConfig(annotations=str(ann), pipeline="none", **QUIET))
    assert any(
        "2 keypoints, another category has 5" in d["reason"] for d in result.manifest.source["dropped"]
    )
    ds = CachedDataset(tmp_path / "c")
    target = next(ds[i][1] for i in range(len(ds)) if ds.source(i) == "0.png")
    assert target["classes"].tolist() == [0, 0, 1]
    np.testing.assert_allclose(target["keypoints"][:2].numpy(), truth["0.png"], atol=1e-4)
    assert target["keypoints"][2].abs().sum() == 0


def test_a_data_yaml_kpt_shape_that_cannot_be_right_is_one_line(tmp_path):
    from cachekit import UsageError

    raw, _ = _yolo(tmp_path)
    for bad, words in (
        ("kpt_shape: [4, 5]", "kpt_shape must be"),
        ("flip_idx: [0, 0, 1, 2]", "flip_idx must"),
        ("flip_idx: [a, 0, 1, 2]", "flip_idx must"),  # not a number: one line, not a TypeError
        # a permutation but no mirror: point 0 would become 1, and 1 become 2, on every flip
        ("flip_idx: [1, 2, 0, 3]", r"swapped in pairs \(point 0 becomes 1 but 1 becomes 2"),
    ):
        text = (raw / "data.yaml").read_text().splitlines()
        key = bad.split(":")[0]
        (raw / "data.yaml").write_text(
            "\n".join([line for line in text if not line.startswith(key)] + [bad]) + "\n"
        )
        with pytest.raises(UsageError, match=words):
            build(raw, tmp_path / f"c{len(words)}", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
        (raw / "data.yaml").write_text("\n".join(text) + "\n")


def test_offline_variants_of_points_without_flip_idx_warn(tmp_path):
    """Flipped variants are baked into the cache: without a flip_idx each one's left points would
    lie on the right, silently; the build says so (as a read-time flip does), and not once given one."""
    import warnings

    raw, _ = _yolo(tmp_path)
    text = (raw / "data.yaml").read_text()
    (raw / "data.yaml").write_text("\n".join(x for x in text.splitlines() if "flip_idx" not in x) + "\n")
    config = BuildConfig(annotations="yolo", pipeline="classification-224", size=32, augment=2, **QUIET)
    with pytest.warns(
        UserWarning, match="--augment stores flipped variants, and the keypoints have no flip_idx"
    ):
        build(raw, tmp_path / "c", config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(raw, tmp_path / "c2", config, flip_idx=[1, 0, 3, 2])
        build(
            raw,
            tmp_path / "c3",
            BuildConfig(annotations="yolo", pipeline="classification-224", size=32, **QUIET),
        )


def test_offline_variants_swap_left_and_right_where_they_flip(tmp_path):
    """One object whose left point lies left of its right point, flip_idx [1, 0]: every stored variant
    (crops, rotations, flips) keeps point 0 left of point 1, which a flip without the swap breaks."""
    raw = tmp_path / "raw"
    (raw / "images").mkdir(parents=True)
    (raw / "labels").mkdir()
    (raw / "data.yaml").write_text("names: [person]\nkpt_shape: [2, 3]\nflip_idx: [1, 0]\n")
    cv2.imwrite(str(raw / "images" / "a.png"), np.full((64, 96, 3), 128, np.uint8))
    (raw / "labels" / "a.txt").write_text("0 0.5 0.5 0.8 0.6 0.3 0.5 2 0.7 0.5 2\n")
    config = BuildConfig(
        annotations="yolo", pipeline="classification-224", size=48, augment=64, augment_rotate=10, **QUIET
    )
    build(raw, tmp_path / "c", config)
    ds = CachedDataset(tmp_path / "c")
    both = 0
    for i in range(len(ds)):
        points, boxes = ds[i][1]["keypoints"].numpy(), ds[i][1]["boxes"].numpy()
        for (x0, y0, x1, y1), pts in zip(boxes, points):  # a visible point lies inside its object's box
            seen = pts[pts[:, 2] > 0]
            assert ((seen[:, 0] >= x0 - 0.5) & (seen[:, 0] <= x1 + 0.5)).all(), (i, pts, boxes)
            assert ((seen[:, 1] >= y0 - 0.5) & (seen[:, 1] <= y1 + 0.5)).all(), (i, pts, boxes)
        if len(points) and (points[0, :, 2] > 0).all():
            both += 1
            assert points[0, 0, 0] < points[0, 1, 0], (i, points)
    assert both >= 8
