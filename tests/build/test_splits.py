"""A dataset's splits never merge: a RAW that names splits (a YOLO data.yaml, Hugging Face Parquet
file names, train/ val/ folders) builds one cache per split at OUT/<split>, with one class list."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from sourcekit import make_objects, write_parquet

from cachekit import BuildConfig, CachedDataset, build, make_loader, verify
from cachekit.build.sources.splitnames import split_of_name
from cachekit.cli import main
from cachekit.errors import NotACacheError, UsageError
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.tools.synthetic_objects import make_object_dataset, object_classes

QUIET = {"progress": False, "workers": 1}


def _sources(cache: Path) -> list[str]:
    """The source path of every sample of a cache, as its shards record them."""
    ds = CachedDataset(cache)
    return sorted(ds.source(i) for i in range(len(ds)))


def _yolo_tree(root: Path, counts: dict[str, int]) -> Path:
    """An Ultralytics tree: images/<split>/, labels/<split>/ and a data.yaml naming the splits."""
    for k, (split, n) in enumerate(counts.items()):
        part = make_object_dataset(root.parent / f"part-{split}", n, size=(40, 52), classes=3, seed=k)
        for kind in ("images", "labels"):
            (root / kind / split).mkdir(parents=True)
            for p in sorted((part / kind).iterdir()):
                shutil.copy(p, root / kind / split / f"{split}_{p.name}")
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(object_classes(3)))
    keys = "".join(f"{s}: images/{s}\n" for s in counts)
    (root / "data.yaml").write_text(f"path: .\n{keys}names:\n{names}\n")
    return root


def _yolo_rows(cache: Path, rel: str) -> np.ndarray:
    """The boxes (class first) of one sample of a YOLO cache, found by its source path."""
    ds = CachedDataset(cache)
    i = next(i for i in range(len(ds)) if ds.source(i) == rel)
    target = ds[i][1]
    return np.column_stack([target["classes"].numpy(), target["boxes"].numpy()])


def test_yolo_data_yaml_builds_one_cache_per_split(tmp_path):
    raw = _yolo_tree(tmp_path / "yolo", {"train": 5, "val": 3})
    out = tmp_path / "c"
    args = ["build", str(raw), "--out", str(out), "--annotations", "yolo", "--pipeline", "none", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert not (out / "manifest.json").exists()
    train, val = _sources(out / "train"), _sources(out / "val")
    assert train == [f"images/train/train_img_{i:05d}.png" for i in range(5)]  # relative to RAW
    assert val == [f"images/val/val_img_{i:05d}.png" for i in range(3)]
    assert "more than one split" not in result.stderr
    lines = [line for line in result.stdout.splitlines() if "splits" in line]
    assert len(lines) == 1 and "train 5" in lines[0] and "val 3" in lines[0], result.stdout
    for split in ("train", "val"):
        m = CachedDataset(out / split).manifest
        assert m.classes == tuple(object_classes(3))
    # a val sample's boxes are its own label file's (not a train image's of the same name)
    label = (raw / "labels" / "val" / "val_img_00001.txt").read_text().split()
    rows = _yolo_rows(out / "val", "images/val/val_img_00001.png")
    assert rows[:, 0].tolist() == [int(v) for v in label[0::5]]
    width = cv2.imread(str(raw / "images" / "val" / "val_img_00001.png")).shape[1]
    cx = (rows[:, 1] + rows[:, 3]) / 2 / width  # the box's centre, normalised, as its label file says
    assert np.allclose(cx, [float(v) for v in label[1::5]], atol=1e-3)


def test_yolo_lists_and_text_files_of_images(tmp_path):
    raw = _yolo_tree(tmp_path / "yolo", {"train": 4, "val": 3})
    (raw / "images" / "extra").mkdir()
    (raw / "labels" / "extra").mkdir()
    for p in sorted((raw / "images" / "val").iterdir())[:1]:  # one val image moved to a second folder
        p.rename(raw / "images" / "extra" / p.name)
        (raw / "labels" / "val" / f"{p.stem}.txt").rename(raw / "labels" / "extra" / f"{p.stem}.txt")
    listed = sorted((raw / "images" / "train").iterdir())[:3]
    (raw / "train.txt").write_text(
        "".join(f"./images/train/{p.name}\n" for p in listed) + "./images/train/gone.png\n/elsewhere/x.png\n"
    )
    yaml = (raw / "data.yaml").read_text().replace("train: images/train", "train: train.txt")
    yaml = yaml.replace("val: images/val", "val: [images/val, images/extra]")
    (raw / "data.yaml").write_text(yaml)
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    assert result.splits == ("train", "val")
    assert _sources(tmp_path / "c" / "train") == [f"images/train/{p.name}" for p in listed]
    assert _sources(tmp_path / "c" / "val") == [
        "images/extra/val_img_00000.png",
        "images/val/val_img_00001.png",
        "images/val/val_img_00002.png",
    ]
    skipped = [s.path for s in result["train"].manifest.skipped]
    assert skipped == ["/elsewhere/x.png", "images/train/gone.png"]
    reasons = [s.reason for s in result["train"].manifest.skipped]
    assert "not under" in reasons[0] and "not an image of" in reasons[1]


def test_yolo_path_key_is_where_the_splits_are(tmp_path):
    data = _yolo_tree(tmp_path / "datasets" / "toy", {"train": 3, "val": 2})
    raw = tmp_path / "cfg"
    raw.mkdir()
    text = (data / "data.yaml").read_text().replace("path: .", "path: ../datasets/toy")
    (raw / "toy.yaml").write_text(text)
    result = build(
        data, tmp_path / "c", BuildConfig(annotations=str(raw / "toy.yaml"), pipeline="none", **QUIET)
    )
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 3, "val": 2}


def test_yolo_single_split_of_every_image_is_the_dataset(tmp_path):
    raw = make_object_dataset(tmp_path / "raw", 4, size=(40, 52), classes=3)  # data.yaml: train: images
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    assert result.manifest.num_samples == 4
    assert (tmp_path / "c" / "manifest.json").exists()


def test_yolo_split_folders_without_yaml_keys(tmp_path):
    raw = _yolo_tree(tmp_path / "yolo", {"train": 3, "test": 2})
    (raw / "data.yaml").write_text("names: [a, b, c]\n")  # no train/val: images/<split>/ name them
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 3, "test": 2}
    assert result["test"].manifest.classes == ("a", "b", "c")


def test_an_image_in_two_splits_is_reported(tmp_path):
    raw = _yolo_tree(tmp_path / "yolo", {"train": 4, "val": 2})
    (raw / "data.yaml").write_text((raw / "data.yaml").read_text() + "test: [images/val, images/train]\n")
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(tmp_path / "c"), "--annotations", "yolo", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if "more than one split" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: 6 inputs"), result.stderr
    assert "images/train/train_img_00000.png (train and test)" in warning[0]
    assert len(_sources(tmp_path / "c" / "test")) == 6  # reported, and built as the yaml says
    with pytest.warns(UserWarning, match="2 inputs .* more than one split"):
        (raw / "data.yaml").write_text(
            (raw / "data.yaml").read_text().replace("test: [images/val, images/train]", "test: images/val")
        )
        build(raw, tmp_path / "d", BuildConfig(annotations="yolo", pipeline="none", **QUIET))


def test_a_hard_link_in_two_splits_is_reported(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 4, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", 2, classes=2, size=(32, 40), seed=2)
    first = sorted((raw / "train" / "class_000").iterdir())[0]
    (raw / "val" / "class_000" / "copy.jpg").hardlink_to(first)
    with pytest.warns(UserWarning, match=r"^1 inputs .* more than one split.*class_000/copy.jpg \(val\)"):
        build(raw, tmp_path / "c", BuildConfig(pipeline="none", **QUIET))


def test_parquet_repo_builds_one_cache_per_split(tmp_path):
    _, items = make_objects(tmp_path / "objects", 7)
    repo = tmp_path / "repo"
    write_parquet(items[:5], repo / "data", files=2)  # data/train-0000k.parquet
    test_files = write_parquet(items[5:], tmp_path / "t", files=1)
    (tmp_path / "t" / "train-00000.parquet").rename(repo / "data" / "test-00000-of-00001.parquet")
    assert test_files
    result = build(repo, tmp_path / "c", BuildConfig(pipeline="none", **QUIET), box_format="xywh")
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 5, "test": 2}
    train, test = _sources(tmp_path / "c" / "train"), _sources(tmp_path / "c" / "test")
    assert all(p.startswith("data/train-") for p in train) and all(p.startswith("data/test-") for p in test)
    assert CachedDataset(tmp_path / "c" / "test").manifest.classes == tuple(object_classes(3))
    # the same files named by a pattern split the same way; one split's pattern builds one cache
    again = build(
        str(repo / "data" / "*.parquet"),
        tmp_path / "d",
        BuildConfig(pipeline="none", **QUIET),
        box_format="xywh",
    )
    assert again.splits == ("train", "test")
    one = build(
        str(repo / "data" / "test-*.parquet"),
        tmp_path / "e",
        BuildConfig(pipeline="none", **QUIET),
        box_format="xywh",
    )
    assert one.manifest.num_samples == 2


def test_split_files_in_several_folders_and_tars(tmp_path):
    from sourcekit import write_tars

    _, items = make_objects(tmp_path / "objects", 6)
    write_parquet(items[:2], tmp_path / "repo" / "x", files=1)
    write_parquet(items[2:5], tmp_path / "repo" / "y", files=1)
    (tmp_path / "repo" / "y" / "train-00000.parquet").rename(tmp_path / "repo" / "y" / "train-00001.parquet")
    write_parquet(items[5:], tmp_path / "repo" / "z", files=1)
    (tmp_path / "repo" / "z" / "train-00000.parquet").rename(tmp_path / "repo" / "z" / "val-00000.parquet")
    config = BuildConfig(pipeline="none", **QUIET)
    result = build(str(tmp_path / "repo" / "*" / "*.parquet"), tmp_path / "c", config, box_format="xywh")
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 5, "val": 1}
    assert _sources(tmp_path / "c" / "train")[0].startswith("x/train-00000.parquet/")
    write_tars(items, tmp_path / "tars", files=3)
    (tmp_path / "tars" / "train-000002.tar").rename(tmp_path / "tars" / "test_000002.tar")
    tars = build(str(tmp_path / "tars" / "*.tar"), tmp_path / "t", config, box_format="xywh")
    assert {n: r.manifest.num_samples for n, r in tars.results.items()} == {"train": 4, "test": 2}


def test_a_folder_of_one_splits_files_is_that_split(tmp_path):
    _, items = make_objects(tmp_path / "objects", 3)
    write_parquet(items, tmp_path / "repo" / "data", files=1)
    result = build(
        tmp_path / "repo", tmp_path / "c", BuildConfig(pipeline="none", **QUIET), box_format="xywh"
    )
    assert result.splits == ("train",) and len(CachedDataset(tmp_path / "c", split="train")) == 3


def test_folders_not_all_split_names_are_classes(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 2, classes=1, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "other", 2, classes=1, size=(32, 40), seed=2)
    result = build(raw, tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    assert result.manifest.classes == ("other", "train")


def test_masks_with_a_folder_per_split(tmp_path):
    raw = _yolo_tree(tmp_path / "yolo", {"train": 3, "val": 2})
    for split in ("train", "val"):
        (raw / "masks" / split).mkdir(parents=True)
        for p in (tmp_path / f"part-{split}" / "masks" / "images").iterdir():
            shutil.copy(p, raw / "masks" / split / f"{split}_{p.name}")
    config = BuildConfig(annotations="yolo", masks=str(raw / "masks"), pipeline="none", **QUIET)
    build(raw, tmp_path / "c", config)
    val = CachedDataset(tmp_path / "c", split="val")
    name = val.source(0).removeprefix("images/val/")[:-4]
    want = cv2.imread(str(raw / "masks" / "val" / f"{name}.png"), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(val[0][1]["mask"].numpy(), want)


def test_parquet_split_folders(tmp_path):
    _, items = make_objects(tmp_path / "objects", 6)
    write_parquet(items[:4], tmp_path / "repo" / "train", files=2)
    write_parquet(items[4:], tmp_path / "repo" / "validation", files=1)
    result = build(
        tmp_path / "repo", tmp_path / "c", BuildConfig(pipeline="none", **QUIET), box_format="xywh"
    )
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 4, "validation": 2}


def test_imagefolder_splits_share_one_class_list(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 9, classes=3, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", 4, classes=3, size=(32, 40), seed=2)
    shutil.rmtree(raw / "train" / "class_000")  # train lacks class 0 and val class 2: each split's
    shutil.rmtree(raw / "val" / "class_002")  # own folders would number them apart
    out = tmp_path / "c"
    result = CliRunner().invoke(main, ["build", str(raw), "--out", str(out), "--pipeline", "none", "--quiet"])
    assert result.exit_code == 0, result.output
    val = CachedDataset(out / "val")
    assert (
        val.manifest.classes
        == CachedDataset(out / "train").manifest.classes
        == ("class_000", "class_001", "class_002")
    )
    for i in range(len(val)):
        assert val.manifest.classes[val[i][1]] == val.source(i).split("/")[1]  # val/<class>/...
    assert len(val) == len(list((raw / "val").rglob("*.jpg")))
    assert all(p.startswith("train/") for p in _sources(out / "train"))  # no val image in train
    assert all(p.startswith("val/") for p in _sources(out / "val"))


def test_split_option_builds_only_those(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 6, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "test", 2, classes=2, size=(32, 40), seed=2)
    result = CliRunner().invoke(
        main,
        ["build", str(raw), "--out", str(tmp_path / "c"), "--split", "test", "--quiet", "--pipeline", "none"],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "c" / "test" / "manifest.json").exists() and not (tmp_path / "c" / "train").exists()
    bad = CliRunner().invoke(main, ["build", str(raw), "--out", str(tmp_path / "d"), "--split", "val"])
    assert bad.exit_code == 2
    assert "holds the splits train, test" in bad.output and "Traceback" not in bad.output
    with pytest.raises(UsageError, match="give split names"):
        build(raw, tmp_path / "f", BuildConfig(**QUIET), split=3)
    with pytest.raises(UsageError, match="inside RAW"):  # beside the splits, it would be read back
        build(raw, raw / "cache", BuildConfig(**QUIET))
    with pytest.raises(UsageError, match="names no splits"):
        build(raw / "train", tmp_path / "e", BuildConfig(**QUIET), split="train")


def test_rerun_reuses_every_split_and_update_is_per_split(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 6, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", 3, classes=2, size=(32, 40), seed=2)
    config = BuildConfig(pipeline="none", **QUIET)
    build(raw, tmp_path / "c", config)
    again = build(raw, tmp_path / "c", config)
    assert {n: r.status for n, r in again.results.items()} == {"train": "up to date", "val": "up to date"}
    extra = next((raw / "val" / "class_001").iterdir())
    shutil.copy(extra, extra.with_name("added.jpg"))
    updated = build(raw, tmp_path / "c", BuildConfig(pipeline="none", update=True, **QUIET))
    assert updated["train"].status == "up to date" and updated["val"].status == "updated"
    assert updated["val"].manifest.num_samples == 4


def test_a_folder_of_splits_opens_one_split(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 6, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", 3, classes=2, size=(32, 40), seed=2)
    build(raw, tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    with pytest.raises(
        NotACacheError, match=r'holds splits train, val.*CachedDataset\(".*c", split="train"\)'
    ):
        CachedDataset(tmp_path / "c")
    assert len(CachedDataset(tmp_path / "c", split="val")) == 3
    with pytest.raises(NotACacheError, match="no split 'test'.*train, val"):
        CachedDataset(tmp_path / "c", split="test")
    with pytest.raises(UsageError, match="plain folder name"):
        CachedDataset(tmp_path / "c", split="../c/train")
    with pytest.raises(NotACacheError, match=r"holds splits train, val.*verify\("):
        verify(tmp_path / "c")
    loader = make_loader(str(tmp_path / "c"), batch_size=2, workers=0, split="val", shuffle=False, pad=True)
    assert len(loader.dataset) == 3 and sum(len(batch[0]) for batch in loader) == 3
    info = CliRunner().invoke(main, ["info", str(tmp_path / "c")])
    assert info.exit_code == 0 and "split train" in info.output and "split val" in info.output, info.output
    ok = CliRunner().invoke(main, ["verify", str(tmp_path / "c")])
    assert ok.exit_code == 0 and ok.output.count("split ") == 2, ok.output
    shard = next(p for p in (tmp_path / "c" / "val").iterdir() if p.name.startswith("shard"))
    with open(shard, "r+b") as f:
        f.seek(f.seek(0, 2) // 2)
        f.write(b"\xff\x00\xff")
    bad = CliRunner().invoke(main, ["verify", str(tmp_path / "c")])
    assert bad.exit_code == 1 and "problems in split val" in bad.output


def test_an_older_merged_cache_in_out_is_not_written_into(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 4, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", 2, classes=2, size=(32, 40), seed=2)
    build(raw / "train", tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    with pytest.raises(UsageError, match="one cache of all"):
        build(raw, tmp_path / "c", BuildConfig(pipeline="none", **QUIET))


def test_a_folder_without_splits_builds_as_before(small_tree, tmp_path):
    result = build(small_tree, tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    assert result.manifest.num_samples == 40 and (tmp_path / "c" / "manifest.json").exists()


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("train-00000-of-00002.parquet", "train"),
        ("test.parquet", "test"),
        ("validation_0.tar", "validation"),
        ("data/val/0001.parquet", "val"),
        ("train/extra/valid/x.tar", "valid"),
        ("trainer-0.parquet", None),
        ("data/0001.parquet", None),
    ],
)
def test_split_of_a_file_name(name, split):
    assert split_of_name(name) == split


def test_records_of_no_split_beside_split_files_are_one_line(tmp_path):
    _, items = make_objects(tmp_path / "objects", 4)
    write_parquet(items, tmp_path / "repo", files=2)
    (tmp_path / "repo" / "train-00001.parquet").rename(tmp_path / "repo" / "test-00001.parquet")
    (tmp_path / "repo" / "train-00000.parquet").rename(tmp_path / "repo" / "extra.parquet")
    shutil.copy(tmp_path / "repo" / "test-00001.parquet", tmp_path / "repo" / "train-00009.parquet")
    with pytest.raises(UsageError, match="1 of no split .*extra.parquet"):
        build(str(tmp_path / "repo" / "*.parquet"), tmp_path / "c", BuildConfig(**QUIET))
