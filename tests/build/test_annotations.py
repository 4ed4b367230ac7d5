"""Annotation sources: COCO and YOLO give the same boxes, masks and CSV fields survive every step,
and hostile annotations are reported, never a traceback."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from manifests import listed_manifest

from cachekit import BuildConfig, CachedDataset, UsageError, build, read_manifest
from cachekit.cli import main
from cachekit.tools.convert import convert
from cachekit.tools.synthetic_objects import make_object_dataset, object_classes
from cachekit.tools.verify import verify
from cachekit.transforms import RandomResizedCrop

QUIET = {"workers": 1, "progress": False}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_object_dataset(tmp_path_factory.mktemp("ann") / "raw", 10, size=(90, 120), classes=3)


@pytest.fixture
def raw(objects, tmp_path):
    shutil.copytree(objects, tmp_path / "raw")
    return tmp_path / "raw"


def _boxes_by_source(cache) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    ds = CachedDataset(cache)
    out = {}
    for i in range(len(ds)):
        _, t = ds[i]
        order = np.lexsort(t["boxes"].numpy().T[::-1])
        out[ds.source(i)] = (t["boxes"].numpy()[order], t["classes"].numpy()[order])
    return out


def test_coco_and_yolo_give_the_same_boxes_and_classes(objects, tmp_path):
    coco = build(
        objects,
        tmp_path / "coco",
        BuildConfig(annotations=str(objects / "coco.json"), pipeline="none", **QUIET),
    )
    yolo = build(objects, tmp_path / "yolo", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    assert coco.manifest.classes == yolo.manifest.classes == tuple(object_classes(3))
    assert coco.manifest.source["category_ids"] == [10, 11, 12]
    a, b = _boxes_by_source(tmp_path / "coco"), _boxes_by_source(tmp_path / "yolo")
    assert a.keys() == b.keys() and len(a) == 10
    assert sum(len(v[0]) for v in a.values()) > 10 and any(len(v[0]) == 0 for v in a.values())  # empties kept
    for path in a:
        np.testing.assert_allclose(a[path][0], b[path][0], atol=0.01)  # YOLO's text has 6 decimals
        assert np.array_equal(a[path][1], b[path][1])
    assert verify(tmp_path / "coco").ok and read_manifest(tmp_path / "coco").format_version == 5


def test_boxes_mapped_back_through_letterbox_equal_the_annotations(objects, tmp_path):
    build(objects, tmp_path / "lb", BuildConfig(annotations=str(objects / "coco.json"), pipeline="letterbox-640",
                                                 size=200, **QUIET))  # fmt: skip
    coco = json.loads((objects / "coco.json").read_text())
    by_name = {img["file_name"]: img["id"] for img in coco["images"]}
    truth = {}
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        truth.setdefault(ann["image_id"], []).append([x, y, x + w, y + h])
    ds = CachedDataset(tmp_path / "lb")
    for i in range(len(ds)):
        _, t = ds[i]
        extras = ds.extras(i)
        left, top = extras["pad"]
        back = (t["boxes"].numpy() - [left, top, left, top]) / extras["scale"]
        want = np.array(sorted(truth.get(by_name[ds.source(i)], [])), dtype=np.float64).reshape(-1, 4)
        np.testing.assert_allclose(np.array(sorted(back.tolist())).reshape(-1, 4), want, atol=0.5)


def test_masks_multi_labels_and_captions_survive_convert_update_and_verify(raw, tmp_path):
    rows = sorted(p.relative_to(raw).as_posix() for p in (raw / "images").glob("*.png"))
    csv = tmp_path / "labels.csv"
    csv.write_text("file,labels,caption\n" + "".join(
        f'{r},{"cat;dog" if i % 3 == 0 else "dog" if i % 3 == 1 else ""},"a photo, number {i} ✓"\n'
        for i, r in enumerate(rows)))  # fmt: skip
    config = BuildConfig(labels=str(csv), masks=str(raw / "masks"), pipeline="classification-224", size=64,
                         shard_size=4, **QUIET)  # fmt: skip
    out = tmp_path / "c"
    built = build(raw, out, config).manifest
    assert set(built.sample.fields) == {"labels", "text", "mask"} and built.classes == ("cat", "dog")

    def contents(cache):
        ds = CachedDataset(cache)
        found = {}
        for i in range(len(ds)):
            image, t = ds[i]
            found[ds.source(i)] = (
                image.numpy().tobytes(),
                t["labels"].tolist(),
                t["text"],
                t["mask"].numpy().tobytes(),
            )
        return found

    before = contents(out)
    assert before[rows[0]][1:3] == ([0, 1], "a photo, number 0 ✓") and before[rows[2]][1] == []
    for fmt in ("hdf5", "zarr", "pt"):
        convert(out, tmp_path / fmt, fmt, progress=False)
        assert verify(tmp_path / fmt).ok and contents(tmp_path / fmt) == before
    mask = cv2.imread(str(raw / "masks" / rows[1].replace(".png", ".png")), cv2.IMREAD_UNCHANGED)
    mask[:] = 2
    cv2.imwrite(str(raw / "masks" / rows[1]), mask)  # a changed mask: only its shard is rebuilt
    with pytest.raises(UsageError, match="--update"):
        build(raw, out, config)
    result = build(raw, out, BuildConfig(**{**config.__dict__, "update": True}))
    assert result.status == "updated" and 0 < result.built_shards < len(result.manifest.shards)
    after = contents(out)
    assert (np.frombuffer(after[rows[1]][3], np.uint8) == 2).all()
    assert {k: v for k, v in after.items() if k != rows[1]} == {
        k: v for k, v in before.items() if k != rows[1]
    }
    assert verify(out).ok


def test_collate_gives_lists_of_dicts_stacked_masks_and_yolo_rows(raw, tmp_path):
    from cachekit import make_loader
    from cachekit.transforms import Letterbox

    build(
        raw,
        tmp_path / "seg",
        BuildConfig(masks=str(raw / "masks"), pipeline="classification-224", size=48, **QUIET),
    )
    images, targets = next(iter(make_loader(tmp_path / "seg", 4, shuffle=False)))
    assert (
        isinstance(targets, dict)
        and targets["mask"].shape == (4, 48, 48)
        and targets["mask"].dtype.itemsize == 1
    )
    build(raw, tmp_path / "det", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    loader = make_loader(tmp_path / "det", 4, shuffle=False, augment=[Letterbox(64)], collate="yolo")
    images, rows = next(iter(loader))
    loader = make_loader(tmp_path / "det", 4, shuffle=False, augment=[Letterbox(64)])
    _, dicts = next(iter(loader))
    assert isinstance(dicts, list) and len(dicts) == 4
    assert rows.shape == (sum(len(d["boxes"]) for d in dicts), 6)
    for i, d in enumerate(dicts):
        mine = rows[rows[:, 0] == i]
        b = d["boxes"]
        np.testing.assert_allclose(mine[:, 2].numpy(), ((b[:, 0] + b[:, 2]) / 2 / 64).numpy(), atol=1e-6)
        np.testing.assert_allclose(mine[:, 1].numpy(), d["classes"].numpy())
    with pytest.raises(ValueError, match="boxes"):
        make_loader(tmp_path / "seg", 4, collate="yolo")


# -- hostile annotations ---------------------------------------------------------------------------


def _coco(raw, **changes):
    coco = json.loads((raw / "coco.json").read_text())
    coco.update(changes)
    return coco


HOSTILE_ANNOTATIONS = {
    "nan": ({"bbox": [float("nan"), 1, 5, 5]}, "not a finite number"),
    "negative size": ({"bbox": [1, 1, -5, 5]}, "no area"),
    "outside": ({"bbox": [500, 500, 10, 10]}, "outside its"),
    "huge": ({"bbox": [0, 0, 1e308, 1e308]}, "not a finite number"),
    "far outside": ({"bbox": [0, 0, 1e6, 1e6]}, "outside its"),
    "unknown category": ({"category_id": 999}, "unknown category_id 999"),
    "unknown image": ({"image_id": 12345}, "unknown image_id 12345"),
    "bad crowd": ({"iscrowd": 7}, "iscrowd 7"),
    "not a list": ({"bbox": "0,0,1,1"}, "not [x, y, width, height]"),
}


@pytest.mark.parametrize("case", list(HOSTILE_ANNOTATIONS))
def test_a_bad_coco_annotation_is_left_out_and_reported(raw, tmp_path, case):
    change, words = HOSTILE_ANNOTATIONS[case]
    coco = _coco(raw)
    coco["annotations"].append({**coco["annotations"][0], "id": 9999, **change})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(coco))
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(tmp_path / "c"), "--annotations", str(path),
                                       "--pipeline", "none", "--workers", "1", "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "annotation left out" in result.output and words in result.output
    m = read_manifest(tmp_path / "c")
    assert m.source["dropped_count"] == 1 and words in m.source["dropped"][0]["reason"]
    assert sum(s.samples for s in m.shards) == 10  # every image is still there


@pytest.mark.parametrize(
    "text, words",
    [
        ("{not json", "not valid JSON"),
        ("[" * 100000 + "]" * 100000, "nested too deeply"),
        ('{"annotations": []}', "no 'images' list"),
        ('{"images": [], "annotations": {}}', "'annotations' is not a list"),
        ("\udcff", "not valid JSON"),
    ],
)
def test_a_file_that_is_not_coco_is_one_line_and_exit_2(raw, tmp_path, text, words):
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(tmp_path / "c"), "--annotations", str(path)]
    )
    assert result.exit_code == 2 and words in result.output and len(result.output.strip().splitlines()) == 1


def test_an_annotations_file_over_the_limit_is_refused_before_it_is_read(raw, tmp_path, monkeypatch):
    import importlib

    monkeypatch.setattr(importlib.import_module("cachekit.build.sources.coco"), "MAX_ANNOTATIONS_BYTES", 1000)
    with pytest.raises(UsageError, match="over the 0 MiB limit .*CACHEKIT_MAX_ANNOTATIONS_BYTES"):
        build(raw, tmp_path / "c", BuildConfig(annotations=str(raw / "coco.json"), **QUIET))


def test_duplicate_and_broken_image_entries_are_left_out(raw, tmp_path):
    coco = _coco(raw)
    first = coco["images"][0]
    coco["images"] += [dict(first), {**first, "id": 777}, {"id": 778, "file_name": "../etc/passwd", "width": 5,
                       "height": 5}, {"id": 779, "file_name": "images/missing.png", "width": 5, "height": 5}]  # fmt: skip
    coco["categories"].append(dict(coco["categories"][0]))
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(coco))
    m = build(raw, tmp_path / "c", BuildConfig(annotations=str(path), pipeline="none", **QUIET)).manifest
    reasons = " | ".join(d["reason"] for d in m.source["dropped"])
    for words in ("listed twice", "no file_name inside RAW", "category id 10 is listed twice"):
        assert words in reasons
    assert [s.path for s in m.skipped] == ["images/missing.png"] and m.num_samples == 10


def test_an_image_of_another_size_than_its_annotations_is_skipped(raw, tmp_path):
    coco = _coco(raw)
    coco["images"][0]["width"] += 7
    path = tmp_path / "size.json"
    path.write_text(json.dumps(coco))
    m = build(raw, tmp_path / "c", BuildConfig(annotations=str(path), pipeline="none", **QUIET)).manifest
    (skip,) = m.skipped
    assert skip.path == coco["images"][0]["file_name"] and "the annotations say" in skip.reason


def test_bad_yolo_rows_are_left_out_and_reported(raw, tmp_path):
    label = raw / "labels" / "img_00000.txt"
    label.write_text(
        label.read_text() + "0 nan 0.5 0.1 0.1\n5 0.5 0.5 0.1 0.1\n0 0.5 0.5\n0 1.5 0.5 0.2 0.2\nx y z w h\n"
    )
    (raw / "labels" / "img_00001.txt").write_bytes(b"\xff\xfe\x00binary")
    (raw / "labels" / "img_00002.txt").unlink()  # no label file: a background image
    m = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET)).manifest
    reasons = [f"{d['where']}: {d['reason']}" for d in m.source["dropped"]]
    assert any("line" in r and "finite" in r for r in reasons)
    assert any("class 5 is not a known class index" in r for r in reasons)
    assert any("3 values" in r for r in reasons) and any("outside the image" in r for r in reasons)
    assert any("not a number" in r for r in reasons)
    (skip,) = m.skipped  # an unusable label file: its objects would be learnt as background
    assert skip.path == "images/img_00001.png" and "not UTF-8" in skip.reason
    assert m.num_samples == 9


def test_masks_of_another_size_colour_or_missing_skip_their_samples(raw, tmp_path):
    masks = raw / "masks" / "images"
    cv2.imwrite(str(masks / "img_00000.png"), np.zeros((5, 5), np.uint8))
    cv2.imwrite(str(masks / "img_00001.png"), np.zeros((90, 120, 3), np.uint8) + 40)
    (masks / "img_00002.png").unlink()
    (masks / "img_00003.png").write_bytes(b"not a png")
    m = build(raw, tmp_path / "c", BuildConfig(masks=str(raw / "masks"), pipeline="none", **QUIET)).manifest
    reasons = {s.path: s.reason for s in m.skipped}
    assert "its mask images/img_00000.png is 5x5" in reasons["images/img_00000.png"]
    assert "not a class map" in reasons["images/img_00001.png"]
    assert "no mask at" in reasons["images/img_00002.png"]
    assert "does not decode" in reasons["images/img_00003.png"]
    assert m.num_samples == 6 and verify(tmp_path / "c").ok


def test_array_fields_of_fixed_and_varying_shape_survive_convert_and_refuse_pickles(raw, tmp_path):
    rows = sorted(p.relative_to(raw).as_posix() for p in (raw / "images").glob("*.png"))
    fixed, varying = tmp_path / "emb", tmp_path / "points"
    for i, rel in enumerate(rows):
        for folder in (fixed, varying):
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        np.save(
            fixed / rel.replace(".png", ".npy"), np.full(4, i, dtype=">f8")
        )  # big-endian: stored as "<f8"
        np.save(varying / rel.replace(".png", ".npy"), np.arange(2 * (i + 1), dtype=np.int32).reshape(2, -1))
    np.save(
        fixed / rows[1].replace(".png", ".npy"), np.array([object()] * 4, dtype=object), allow_pickle=True
    )
    np.save(fixed / rows[2].replace(".png", ".npy"), np.zeros(4, dtype=np.complex64))
    (fixed / rows[3].replace(".png", ".npy")).unlink()
    config = BuildConfig(arrays={"emb": str(fixed), "points": str(varying)}, pipeline="classification-224", size=32,
                         **QUIET)  # fmt: skip
    m = build(raw, tmp_path / "c", config).manifest
    assert m.sample.to_json()["fields"] == {
        "label": {"kind": "label"},  # the class of an ImageFolder's image stays in the target
        "emb": {"kind": "array", "dtype": "<f8", "shape": [4]},
        "points": {"kind": "array", "dtype": "<i4", "shape": [2, None]},
    }
    reasons = {s.path: s.reason for s in m.skipped}
    assert (
        "Python objects" in reasons[rows[1]]
        and "dtype <c8" in reasons[rows[2]]
        and "not found" in reasons[rows[3]]
    )
    for fmt in ("hdf5", "zarr"):
        convert(tmp_path / "c", tmp_path / fmt, fmt, progress=False)
        ds = CachedDataset(tmp_path / fmt)
        for i in range(len(ds)):
            _, t = ds[i]
            k = rows.index(ds.source(i))
            assert t["emb"].tolist() == [float(k)] * 4 and t["points"].shape == (2, k + 1)
        assert verify(tmp_path / fmt).ok
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(tmp_path / "d"), "--array", "emb"])
    assert result.exit_code == 2 and "--array takes NAME=DIR" in result.output


# -- found by review: builds that would write a cache they cannot read, and hostile annotations ------


@pytest.mark.parametrize(
    "name, words", [("Depth", "bad field name"), ("classes", "taken"), ("a__b", "bad field")]
)
def test_an_array_field_a_cache_could_not_hold_is_refused_before_any_work(raw, tmp_path, name, words):
    (tmp_path / "npy").mkdir()
    with pytest.raises(UsageError, match=words):
        build(
            raw,
            tmp_path / "c",
            BuildConfig(annotations="yolo", arrays={name: str(tmp_path / "npy")}, **QUIET),
        )
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_an_array_named_as_a_column_is_refused_by_the_manifest_round_trip(raw, tmp_path):
    rows = sorted(p.relative_to(raw).as_posix() for p in (raw / "images").glob("*.png"))
    for rel in rows:
        (tmp_path / "npy" / rel).parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp_path / "npy" / rel.replace(".png", ".npy"), np.zeros(2, np.int32))
    with pytest.raises(UsageError, match="cannot be stored.*orig_size"):
        build(
            raw,
            tmp_path / "c",
            BuildConfig(annotations="yolo", arrays={"orig_size": str(tmp_path / "npy")}, **QUIET),
        )


def test_a_huge_class_index_is_a_bad_row_or_one_line_never_a_billion_names(raw, tmp_path):
    (raw / "data.yaml").unlink()
    label = raw / "labels" / "img_00003.txt"
    label.write_text(label.read_text() + "99999999 0.5 0.5 0.2 0.2\n")
    m = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET)).manifest
    assert len(m.classes) == 3 and any(
        "99999999 is not a known class" in d["reason"] for d in m.source["dropped"]
    )
    csv = tmp_path / "l.csv"
    csv.write_text("images/img_00001.png,99999999\n")
    with pytest.raises(UsageError, match="past the 1048576 classes"):
        build(raw, tmp_path / "d", BuildConfig(labels=str(csv), **QUIET))


def test_fast_decode_with_coco_boxes_or_masks_is_refused(raw, tmp_path):
    for options in ({"annotations": str(raw / "coco.json")}, {"masks": str(raw / "masks")}):
        with pytest.raises(UsageError, match="--fast-decode"):
            build(raw, tmp_path / "c", BuildConfig(fast_decode=True, **options, **QUIET))


def test_a_coco_number_too_large_for_a_float_is_a_bad_box(raw, tmp_path):
    coco = _coco(raw)
    coco["annotations"].append({**coco["annotations"][0], "id": 777, "bbox": [10**400, 0, 5, 5]})
    path = tmp_path / "big.json"
    path.write_text(json.dumps(coco))
    m = build(raw, tmp_path / "c", BuildConfig(annotations=str(path), pipeline="none", **QUIET)).manifest
    assert m.source["dropped_count"] == 1 and "not a finite number" in m.source["dropped"][0]["reason"]


def test_a_yolo_split_is_built_from_its_images_folder(raw, tmp_path):
    for kind in ("images", "labels"):
        (raw / kind / "train").mkdir()
        for p in sorted((raw / kind).glob("img_0000[0-5].*")):
            p.rename(raw / kind / "train" / p.name)
    m = build(
        raw / "images" / "train", tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET)
    ).manifest
    assert m.num_samples == 6 and m.classes == tuple(object_classes(3))  # data.yaml at the dataset's root
    whole = _boxes_by_source(tmp_path / "c")
    assert sum(len(b) for b, _ in whole.values()) > 0


def test_a_label_file_that_is_not_a_file_skips_its_image(raw, tmp_path):
    import os

    (raw / "labels" / "img_00004.txt").unlink()
    os.mkfifo(raw / "labels" / "img_00004.txt")
    m = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET)).manifest
    (skip,) = m.skipped
    assert skip.path == "images/img_00004.png" and "not a regular file" in skip.reason


def test_an_image_folder_with_masks_keeps_the_class_in_the_target(tmp_path):
    for c in ("cat", "dog"):
        (tmp_path / "raw" / c).mkdir(parents=True)
        (tmp_path / "masks" / c).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "raw" / c / "a.png"), np.full((20, 30, 3), 90, np.uint8))
        cv2.imwrite(str(tmp_path / "masks" / c / "a.png"), np.ones((20, 30), np.uint8))
    build(
        tmp_path / "raw", tmp_path / "c", BuildConfig(masks=str(tmp_path / "masks"), pipeline="none", **QUIET)
    )
    ds = CachedDataset(tmp_path / "c")
    assert sorted(ds[i][1]["label"] for i in range(2)) == [0, 1] and set(ds.fields) == {"label", "mask"}


def test_yolo_rows_leave_crowds_out_and_padded_batches_normalise_by_the_padded_size(raw, tmp_path):
    from cachekit import make_loader

    coco = _coco(raw)
    for ann in coco["annotations"]:
        ann["iscrowd"] = 1 if ann["id"] % 2 else 0
    path = tmp_path / "crowd.json"
    path.write_text(json.dumps(coco))
    build(raw, tmp_path / "c", BuildConfig(annotations=str(path), pipeline="none", **QUIET))
    images, rows, sizes = next(iter(make_loader(tmp_path / "c", 4, shuffle=False, pad=True, collate="yolo")))
    _, dicts, _ = next(iter(make_loader(tmp_path / "c", 4, shuffle=False, pad=True)))
    kept = [d["boxes"][d["iscrowd"] == 0] for d in dicts]
    assert len(rows) == sum(len(b) for b in kept)
    h, w = images.shape[-2:]
    for i, b in enumerate(kept):
        np.testing.assert_allclose(
            rows[rows[:, 0] == i][:, 2].numpy(), ((b[:, 0] + b[:, 2]) / 2 / w).numpy(), atol=1e-6
        )


def test_transforms_moves_pixels_and_targets_together(raw, tmp_path):
    import torch

    build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="letterbox-640", size=64, **QUIET))

    def halve(image, target):
        return image[:, ::2, ::2], {**target, "boxes": target["boxes"] / 2}

    ds = CachedDataset(tmp_path / "c", transforms=halve)
    image, target = ds[0]
    plain_image, plain_target = CachedDataset(tmp_path / "c")[0]
    assert image.shape == (3, 32, 32) and torch.equal(target["boxes"], plain_target["boxes"] / 2)
    with pytest.warns(UserWarning, match="transform= sees only the image"):
        CachedDataset(tmp_path / "c", transform=lambda x: x)


def _rewrite_pt(cache, change):
    """Change a .pt shard's columns with ``change(columns)`` and make the manifest agree, as an attacker would."""
    import torch

    from cachekit.store.atomic import sha256_path

    manifest = listed_manifest(cache)
    info = manifest["shards"][0]
    path = cache / info["file"]
    columns = torch.load(path, weights_only=True)
    change(columns)
    with open(path, "wb") as fh:
        torch.save(columns, fh)
    info["bytes"], info["sha256"] = path.stat().st_size, sha256_path(path)
    (cache / "manifest.json").write_text(json.dumps(manifest))


def test_a_mask_of_another_size_or_a_png_bomb_in_a_shard_is_refused_before_it_is_decoded(raw, tmp_path):
    import torch

    from cachekit import CacheError, make_loader
    from cachekit.store.fields import encode_mask

    build(
        raw, tmp_path / "c", BuildConfig(masks=str(raw / "masks"), pipeline="none", shard_size=100, **QUIET)
    )

    def swap_first_mask(columns, mask):
        data, offsets = columns["mask__png"].numpy(), columns["mask__offsets"].numpy()
        new = encode_mask(mask)
        columns["mask__png"] = torch.from_numpy(np.concatenate([new, data[offsets[1] :]]))
        columns["mask__offsets"] = torch.from_numpy(
            np.concatenate([[0], offsets[1:] - offsets[1] + len(new)])
        )

    _rewrite_pt(tmp_path / "c", lambda cols: swap_first_mask(cols, np.zeros((10, 10), np.uint8)))
    with pytest.raises(CacheError, match="a stored mask is 10x10"):
        CachedDataset(tmp_path / "c")[0]
    with pytest.raises(CacheError, match="a stored mask is 10x10"):
        list(make_loader(tmp_path / "c", 12, shuffle=False, augment=[RandomResizedCrop(16)]))
    assert "a stored mask is 10x10" in verify(tmp_path / "c").problems[0].problem
    bomb = encode_mask(np.zeros((20000, 20000), np.uint8))  # a few hundred KB declaring 400 MB
    _rewrite_pt(tmp_path / "c", lambda cols: swap_first_mask(cols, np.zeros((1, 1), np.uint8)))
    _rewrite_pt(tmp_path / "c", lambda cols: cols.update(
        mask__png=torch.from_numpy(np.concatenate([bomb, cols["mask__png"].numpy()[cols["mask__offsets"].numpy()[1]:]])),
        mask__offsets=torch.from_numpy(np.concatenate([[0], cols["mask__offsets"].numpy()[1:]
                                                       - cols["mask__offsets"].numpy()[1] + len(bomb)]))))  # fmt: skip
    with pytest.raises(CacheError, match="a stored mask is 20000x20000"):
        CachedDataset(tmp_path / "c")[0]
