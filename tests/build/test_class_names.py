"""Class names a user fixes: a mask cache takes no folder classes, ``--mask-classes`` (or VOC's
palette) names the mask's values, and ``--classes`` gives one class order to every source."""

from __future__ import annotations

import json
import shutil

import cv2
import pytest
from click.testing import CliRunner
from PIL import Image

from cachekit import BuildConfig, CachedDataset, UsageError, build
from cachekit.build.sources.classnames import VOC_CLASSES, _voc_colour
from cachekit.cli import main
from cachekit.tools.synthetic_objects import make_object_dataset, object_classes

QUIET = {"workers": 1, "progress": False, "pipeline": "none"}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    """RAW/images/*.png with their YOLO labels, COCO JSON and masks (moved out of RAW, as users keep them)."""
    root = tmp_path_factory.mktemp("names")
    raw = make_object_dataset(root / "raw", 6, size=(40, 60), classes=3)
    shutil.move(str(raw / "masks"), str(root / "masks"))
    return root


def test_masks_over_the_usual_images_layout_make_no_images_class(objects, tmp_path):
    m = build(objects / "raw", tmp_path / "c", BuildConfig(masks=str(objects / "masks"), **QUIET)).manifest
    assert m.classes == () and set(m.sample.fields) == {"mask"}
    ds = CachedDataset(tmp_path / "c")
    _, target = ds[0]
    assert set(target) == {"mask"} and int(ds.read_batch([0])[1][0]) == -1


def test_mask_classes_name_the_masks_values(objects, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("# what each value of a mask means\nbackground\nthing\nstuff\nother\n")
    config = BuildConfig(masks=str(objects / "masks"), mask_classes=str(names), **QUIET)
    m = build(objects / "raw", tmp_path / "c", config).manifest
    assert m.classes == ("background", "thing", "stuff", "other")
    assert m.sample.fields["mask"].params == {"classes": ["background", "thing", "stuff", "other"]}
    assert CachedDataset(tmp_path / "c").classes == ["background", "thing", "stuff", "other"]
    with pytest.raises(UsageError, match="give --masks too"):
        build(objects / "raw", tmp_path / "d", BuildConfig(mask_classes=str(names), **QUIET))
    names.write_text("a\nb\na\n")
    with pytest.raises(UsageError, match="names 'a' twice"):
        build(objects / "raw", tmp_path / "e", config)


def test_voc_palette_masks_bring_vocs_names(objects, tmp_path):
    palette = [v for i in range(256) for v in _voc_colour(i)]
    for path in sorted((objects / "masks").rglob("*.png")):
        target = tmp_path / "voc" / path.relative_to(objects / "masks")
        target.parent.mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(cv2.imread(str(path), cv2.IMREAD_UNCHANGED), mode="P")
        image.putpalette(palette)
        image.save(target)
    m = build(objects / "raw", tmp_path / "c", BuildConfig(masks=str(tmp_path / "voc"), **QUIET)).manifest
    assert m.classes == VOC_CLASSES and m.sample.fields["mask"].params["classes"][15] == "person"


def _index_of_each_source(cache) -> dict[str, int]:
    ds = CachedDataset(cache)
    return {ds.source(i): int(ds.read_batch([i])[1][0]) for i in range(len(ds))}


def test_classes_give_a_folder_tree_and_a_csv_one_order(tmp_path):
    from cachekit.tools.synthetic import make_synthetic_folder

    raw = make_synthetic_folder(tmp_path / "raw", 9, classes=3, size=(20, 24), seed=2)
    folders = sorted(p.name for p in raw.iterdir())
    csv = tmp_path / "labels.csv"
    csv.write_text(
        "".join(f"{p.relative_to(raw).as_posix()},{p.parent.name}\n" for p in sorted(raw.rglob("*.jpg")))
    )
    names = tmp_path / "names.txt"
    order = [folders[2], "unused", folders[0], folders[1]]
    names.write_text("\n".join(order) + "\n")
    for how, extra in (("tree", {}), ("csv", {"labels": str(csv)})):
        build(
            raw,
            tmp_path / how,
            BuildConfig(classes=str(names), size=16, **{**QUIET, "pipeline": "classification-224"}, **extra),
        )
        assert CachedDataset(tmp_path / how).classes == order
        got = _index_of_each_source(tmp_path / how)
        assert got == {rel: order.index(rel.split("/")[0]) for rel in got}
    names.write_text(f"{folders[0]}\n{folders[1]}\n")
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(tmp_path / "x"), "--classes", str(names)]
    )
    assert (
        result.exit_code == 2 and f"does not name 1 class(es) the data has: '{folders[2]}'" in result.output
    )


def test_classes_reorder_coco_and_name_yolos_numbers(objects, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(objects / "raw", raw)
    want = list(reversed(object_classes(3)))
    names = tmp_path / "names.txt"
    names.write_text("\n".join(want) + "\n")
    plain = build(raw, tmp_path / "plain", BuildConfig(annotations=str(raw / "coco.json"), **QUIET)).manifest
    build(raw, tmp_path / "c", BuildConfig(annotations=str(raw / "coco.json"), classes=str(names), **QUIET))
    a, b = CachedDataset(tmp_path / "plain"), CachedDataset(tmp_path / "c")
    assert b.classes == want
    for i in range(len(a)):
        j = next(j for j in range(len(b)) if b.source(j) == a.source(i))
        before = [plain.classes[c] for c in a[i][1]["classes"].tolist()]
        assert [want[c] for c in b[j][1]["classes"].tolist()] == before
    (raw / "data.yaml").unlink()  # YOLO numbers: the file names them in index order
    m = build(raw, tmp_path / "y", BuildConfig(annotations="yolo", classes=str(names), **QUIET)).manifest
    assert m.classes == tuple(want)
    json.dumps(m.to_json())


def test_classes_reorder_a_multi_label_csv(tmp_path):
    from cachekit.tools.synthetic import make_synthetic_folder

    raw = make_synthetic_folder(tmp_path / "raw", 6, classes=1, size=(20, 24), seed=3)
    files = sorted(p.relative_to(raw).as_posix() for p in raw.rglob("*.jpg"))
    tags = ["cat;dog", "dog", "bird;cat", "bird", "dog;bird", "cat"]
    csv = tmp_path / "labels.csv"
    csv.write_text("file,labels\n" + "".join(f"{f},{t}\n" for f, t in zip(files, tags)))
    names = tmp_path / "names.txt"
    names.write_text("dog\ncat\nbird\n")
    quiet = {**QUIET, "pipeline": "classification-224", "size": 16}
    build(raw, tmp_path / "c", BuildConfig(labels=str(csv), classes=str(names), **quiet))
    ds = CachedDataset(tmp_path / "c")
    assert ds.classes == ["dog", "cat", "bird"]
    for i in range(len(ds)):
        want = set(tags[files.index(ds.source(i))].split(";"))
        assert {ds.classes[c] for c in ds[i][1]["labels"].tolist()} == want
