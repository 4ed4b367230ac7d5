"""Nothing dropped in silence: a build whose annotations are every one left out (a data.yaml's
kpt_shape that fits no row, classes past the names, COCO annotations of no image, VOC boxes outside
their images) fails with exit 1 and one line, naming the kpt_shape the rows fit when one does, and
writes no cache. Losing some annotations is reported with the cache, as before."""

from __future__ import annotations

import json
import subprocess
import sys

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, BuildError, CachedDataset, build
from cachekit.cli import main

QUIET = {"workers": 1, "progress": False, "order": "sorted", "pipeline": "none"}
SIZES = [(60, 100), (80, 50), (64, 64)]  # (height, width)


def _pose_folder(root, points: int, dims: int = 3, kpt_shape=None, visibility=(0, 1, 2), splits=("",)):
    """A YOLO pose dataset: images/<split>/*.png and their labels, two rows an image of ``points``
    points of ``dims`` values (visibility drawn from ``visibility``), with a data.yaml naming
    ``kpt_shape`` (none when None)."""
    rng = np.random.default_rng(5)
    for split in splits:
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i, (h, w) in enumerate(SIZES):
            cv2.imwrite(str(root / "images" / split / f"{i}.png"), rng.integers(0, 256, (h, w, 3), np.uint8))
            rows = []
            for _ in range(2):
                xy = rng.uniform(0.1, 0.9, (points, 2)).round(4)
                v = rng.choice(visibility, (points, 1))
                v[0] = max(visibility)  # every row holds each value of ``visibility`` (the largest at least)
                pts = np.concatenate([xy, v], 1) if dims == 3 else xy
                rows.append("0 0.5 0.5 0.8 0.8 " + " ".join(f"{x:g}" for x in pts.reshape(-1)))
            (root / "labels" / split / f"{i}.txt").write_text("\n".join(rows) + "\n")
    shape = f"kpt_shape: [{kpt_shape[0]}, {kpt_shape[1]}]\n" if kpt_shape else ""
    (root / "data.yaml").write_text(f"names: [person]\n{shape}")
    return root


def _cli_build(raw, out, *extra):
    """``cachekit build`` in its own process: its exit code and its non-empty stderr lines."""
    proc = subprocess.run(
        [sys.executable, "-m", "cachekit.cli", "build", str(raw), "--out", str(out), "--pipeline", "none",
         "--workers", "1", "--quiet", *extra],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


def test_a_kpt_shape_that_fits_no_row_fails_in_one_line_naming_the_one_that_fits(tmp_path):
    raw = _pose_folder(tmp_path / "raw", points=7, kpt_shape=(5, 3))
    code, lines = _cli_build(raw, tmp_path / "c", "--annotations", "yolo")
    assert code == 1, lines
    assert lines == [
        f"error: {raw / 'data.yaml'}: kpt_shape [5, 3] fits no label row "
        "(rows hold 7 points of 3 values: kpt_shape: [7, 3] would fit)"
    ], lines
    assert not (tmp_path / "c" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("points", "dims", "given", "visibility", "fits"),
    [
        (7, 3, (7, 2), (0, 1, 2), "rows hold 7 points of 3 values: kpt_shape: [7, 3] would fit"),
        (5, 2, (5, 3), (0, 1, 2), "rows hold 5 points of 2 values: kpt_shape: [5, 2] would fit"),
        # 18 values: 6 points of 3 or 9 of 2; a visibility of 2 is no coordinate, so 3 it is
        (6, 3, (4, 3), (0, 1, 2), "rows hold 6 points of 3 values: kpt_shape: [6, 3] would fit"),
        # visibilities 0 and 1 only, each a coordinate inside the image too: either may be meant
        (6, 3, (4, 3), (0, 1), "rows hold 18 keypoint values: kpt_shape: [6, 3] or [9, 2] would fit"),
        (6, 3, (9, 2), (0, 1, 2), "rows hold 6 points of 3 values: kpt_shape: [6, 3] would fit"),
    ],
)
def test_the_kpt_shape_named_is_the_one_that_reads_the_rows(tmp_path, points, dims, given, visibility, fits):
    raw = _pose_folder(tmp_path / "raw", points, dims, given, visibility)
    with pytest.raises(BuildError) as info:
        build(raw, tmp_path / "c", BuildConfig(annotations="yolo", **QUIET))
    assert str(info.value) == f"{raw / 'data.yaml'}: kpt_shape {list(given)} fits no label row ({fits})"
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_a_pose_dataset_without_kpt_shape_is_told_the_one_its_rows_fit(tmp_path):
    raw = _pose_folder(tmp_path / "raw", points=17)  # 56 values: no box, no polygon
    with pytest.raises(BuildError) as info:
        build(raw, tmp_path / "c", BuildConfig(annotations="yolo", **QUIET))
    said = str(info.value)
    assert said.startswith(
        f"{raw}: every annotation was left out (6; the first, labels/0.txt: line 1: 56 values"
    )
    assert said.endswith(
        ": rows hold 17 points of 3 values: a data.yaml with kpt_shape: [17, 3] would read them"
    )


def test_every_split_s_rows_left_out_fails_before_any_split_is_written(tmp_path):
    raw = _pose_folder(tmp_path / "raw", points=7, kpt_shape=(5, 3), splits=("train", "val"))
    code, lines = _cli_build(raw, tmp_path / "c", "--annotations", "yolo")
    assert code == 1 and len(lines) == 1 and "kpt_shape [5, 3] fits no label row" in lines[0], lines
    assert "kpt_shape: [7, 3] would fit" in lines[0]
    assert not (tmp_path / "c" / "train").exists() and not (tmp_path / "c" / "val").exists()


def test_rows_of_classes_past_the_names_every_one_left_out_fail_naming_the_first(tmp_path):
    raw = tmp_path / "raw"
    _pose_folder(raw, points=1)
    for f in (raw / "labels").iterdir():
        f.write_text("3 0.5 0.5 0.2 0.2\n0 0.5 0.5 0 0.2\n")  # class 3 of 1; a box of no area
    with pytest.raises(BuildError) as info:
        build(raw, tmp_path / "c", BuildConfig(annotations="yolo", **QUIET))
    assert str(info.value) == (
        f"{raw}: every annotation was left out (6; the first, labels/0.txt: line 1: class 3 is not a "
        "known class index (data.yaml names 1)), so no image would hold one"
    )


def test_some_rows_left_out_still_build_and_are_reported(tmp_path):
    raw = _pose_folder(tmp_path / "raw", points=1)
    (raw / "labels" / "0.txt").write_text("0 0.5 0.5 0.2 0.2\n3 0.5 0.5 0.2 0.2\n")
    for name in ("1.txt", "2.txt"):
        (raw / "labels" / name).unlink()  # background images
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", **QUIET))
    assert result.manifest.num_samples == 3 and result.manifest.source["dropped_count"] == 1
    assert [len(CachedDataset(tmp_path / "c")[i][1]["boxes"]) for i in range(3)] == [1, 0, 0]


def test_background_images_alone_build(tmp_path):
    """No label row at all is no row left out: a folder of background images builds."""
    raw = _pose_folder(tmp_path / "raw", points=1)
    for f in list((raw / "labels").iterdir()):
        f.write_text("\n")
    assert build(raw, tmp_path / "c", BuildConfig(annotations="yolo", **QUIET)).manifest.num_samples == 3


def _coco(tmp_path, annotations):
    raw = tmp_path / "raw"
    raw.mkdir(parents=True)
    images = []
    for i, (h, w) in enumerate(SIZES):
        cv2.imwrite(str(raw / f"{i}.png"), np.full((h, w, 3), 40 * i, np.uint8))
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": w, "height": h})
    ann = tmp_path / "ann.json"
    ann.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "a"}]})
    )
    return raw, ann


def test_coco_annotations_every_one_left_out_fail_in_one_line(tmp_path):
    """Annotations of image ids the file does not list (another file's images): exit 1, one line."""
    bad = [{"id": k, "image_id": 10 + k, "category_id": 1, "bbox": [1, 1, 5, 5]} for k in range(4)]
    raw, ann = _coco(tmp_path, bad)
    result = CliRunner().invoke(
        main,
        ["build", str(raw), "--out", str(tmp_path / "c"), "--annotations", str(ann), "--pipeline", "none"],
    )
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (
        f"error: annotations file {ann}: every annotation was left out (4; the first, annotations[0]: "
        "unknown image_id 10), so no image would hold one"
    )
    assert not (tmp_path / "c" / "manifest.json").exists()
    good = [{"id": 9, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5]}]
    raw, ann = _coco(tmp_path / "some", bad + good)  # one kept: built, the others reported
    result = build(raw, tmp_path / "d", BuildConfig(annotations=str(ann), **QUIET))
    assert result.manifest.source["dropped_count"] == 4


def test_voc_objects_every_one_left_out_fail_in_one_line(tmp_path):
    raw = tmp_path / "voc"
    (raw / "Annotations").mkdir(parents=True)
    (raw / "JPEGImages").mkdir()
    for i, (h, w) in enumerate(SIZES):
        cv2.imwrite(str(raw / "JPEGImages" / f"{i}.jpg"), np.full((h, w, 3), 40 * i, np.uint8))
        box = "<xmin>5</xmin><ymin>5</ymin><xmax>500</xmax><ymax>20</ymax>"  # past the image's width
        (raw / "Annotations" / f"{i}.xml").write_text(
            f"<annotation><filename>{i}.jpg</filename><size><width>{w}</width><height>{h}</height></size>"
            f"<object><name>dog</name><bndbox>{box}</bndbox></object></annotation>"
        )
    with pytest.raises(BuildError) as info:
        build(raw, tmp_path / "c", BuildConfig(annotations="voc", **QUIET))
    assert str(info.value) == (
        f"{raw}/Annotations: every annotation was left out (3; the first, Annotations/0.xml object 0: a box "
        "outside the 100x60 image), so no image would hold one"
    )
