"""Splits at their edges: the exact pattern each split of Parquet files is built from, the origin a
refused --split names, a data.yaml's path: and its size, VOC lists with only some of train, val and
trainval, and the one-line messages of image lists and image sets that do not read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from sourcekit import make_objects, write_parquet

from cachekit import UsageError
from cachekit.build.sources.splitnames import split_of_name
from cachekit.build.splits import find_splits, pick_splits, split_out
from cachekit.tools.synthetic import make_synthetic_folder


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    """One real Hugging Face Parquet file (two object images) to copy under each name a test needs."""
    root = tmp_path_factory.mktemp("parquet")
    _, items = make_objects(root / "objects", 2)
    write_parquet(items, root / "one", files=1)
    return root / "one" / "train-00000.parquet"


def _files(parquet: Path, root: Path, names: list[str]) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(parquet, root / name)
    return root


def _raws(found) -> dict[str, str]:
    assert all(split.name == name for name, split in found.items())
    return {name: split.raw for name, split in found.items()}


def test_an_empty_name_is_of_no_split():
    assert split_of_name("") is None


def test_each_split_of_a_folder_of_files_is_the_narrowest_pattern(parquet, tmp_path):
    repo = _files(
        parquet,
        tmp_path / "repo",
        ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test_0.parquet",
         "data/test_1.parquet", "data/validation.parquet"],
    )  # fmt: skip
    found = find_splits(repo)
    assert _raws(found) == {
        "train": f"{repo}/data/train-*.parquet",
        "validation": f"{repo}/data/validation.parquet",
        "test": f"{repo}/data/test_*.parquet",
    }
    assert {s.origin for s in found.values()} == {f"the file names of {repo}/data/*.parquet"}
    flat = _files(parquet, tmp_path / "flat", ["train-0.parquet", "train-1.parquet", "val-0.parquet"])
    assert _raws(find_splits(flat)) == {"train": f"{flat}/train-*.parquet", "val": f"{flat}/val-0.parquet"}


def test_a_split_named_by_its_folder_is_that_folder_and_mixed_names_a_brace_list(parquet, tmp_path):
    repo = _files(
        parquet,
        tmp_path / "repo",
        ["Train/a.parquet", "Train/b.parquet", "test/x-0.parquet", "test/y-0.parquet", "val/val-0.parquet",
         "val/val-1.parquet", "other/val-2.parquet"],
    )  # fmt: skip
    assert _raws(find_splits(f"{repo}/*/*.parquet")) == {
        "train": f"{repo}/Train/*.parquet",
        "val": f"{repo}/{{other/val-2,val/val-0,val/val-1}}.parquet",
        "test": f"{repo}/test/*.parquet",
    }


def test_a_relative_pattern_keeps_its_splits_relative(parquet, tmp_path, monkeypatch):
    _files(parquet, tmp_path, ["train-0.parquet", "train-1.parquet", "test-0.parquet", "test-1.parquet"])
    monkeypatch.chdir(tmp_path)
    assert _raws(find_splits("*.parquet")) == {"train": "train-*.parquet", "test": "test-*.parquet"}
    monkeypatch.chdir(tmp_path.parent)
    assert _raws(find_splits(f"{tmp_path.name}/*.parquet")) == {
        "train": f"{tmp_path.name}/train-*.parquet",
        "test": f"{tmp_path.name}/test-*.parquet",
    }


def test_files_whose_names_hold_pattern_characters_cannot_be_named_apart(parquet, tmp_path):
    repo = _files(parquet, tmp_path, ["a/train-[0].parquet", "b/train-[1].parquet", "a/test-0.parquet"])
    with pytest.raises(UsageError) as err:
        find_splits(f"{repo}/*/*.parquet")
    assert str(err.value) == (
        f"{repo}/*/*.parquet: the files of split train cannot be named apart (a name holds one of "
        "*,?[]{}); give each split's files as their own pattern"
    )


def test_files_of_no_split_and_a_pattern_of_no_files_are_one_line(parquet, tmp_path):
    repo = _files(parquet, tmp_path, ["train-0.parquet", "test-0.parquet", "extra.parquet"])
    with pytest.raises(UsageError) as err:
        find_splits(f"{repo}/*.parquet")
    assert str(err.value) == (
        f"{repo}/*.parquet: files of the splits test, train and 1 of no split (e.g. extra.parquet); "
        "name each split's files in the file or folder name"
    )
    with pytest.raises(UsageError, match=r"names no Parquet files$"):
        find_splits(f"{repo}/none-*.parquet")


def test_a_refused_split_names_what_named_the_splits(parquet, tmp_path):
    repo = _files(parquet, tmp_path, ["train-0.parquet", "test-0.parquet"])
    found = find_splits(f"{repo}/*.parquet")
    with pytest.raises(UsageError) as err:
        pick_splits(found, "val", repo)
    assert (
        str(err.value)
        == f"--split val: {repo} holds the splits train, test (named by the file names of {repo}/*.parquet)"
    )


def _yolo(root: Path, yaml: str, where: str = "") -> Path:
    for split in ("train", "val"):
        make_synthetic_folder(root / where / "images" / split, 2, classes=1, size=(16, 16), seed=len(split))
    (root / "data.yaml").write_text(yaml)
    return root


def test_a_data_yaml_path_is_where_its_splits_are_or_raw_when_it_is_not_here(tmp_path):
    raw = _yolo(tmp_path / "a", "path: ds\ntrain: images/train\nval: images/val\n", where="ds")
    assert _raws(find_splits(raw, "yolo")) == {
        "train": f"{raw}/ds/images/train",
        "val": f"{raw}/ds/images/val",
    }
    gone = tmp_path / "not-on-this-machine"
    raw = _yolo(tmp_path / "b", f"path: {gone}\ntrain: images/train\nval: images/val\n")
    assert _raws(find_splits(raw, "yolo")) == {"train": f"{raw}/images/train", "val": f"{raw}/images/val"}


def test_a_data_yaml_or_an_image_list_that_does_not_read_is_one_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    with (raw / "data.yaml").open("wb") as fh:  # one byte over the 16 MiB a data.yaml may have (sparse)
        fh.truncate((16 << 20) + 1)
    with pytest.raises(UsageError) as err:
        find_splits(raw, "yolo")
    assert (
        str(err.value)
        == f"data.yaml {raw}/data.yaml is {(16 << 20) + 1} bytes, over the {16 << 20} it may have"
    )
    (raw / "data.yaml").write_text("train: train.txt\nval: val.txt\n")
    (raw / "train.txt").write_bytes(b"images/a.jpg\n\xff\n")
    (raw / "val.txt").write_text("images/b.jpg\n")
    with pytest.raises(UsageError) as err:
        find_splits(raw, "yolo")
    assert str(err.value) == (
        f"an image list {raw}/train.txt is not UTF-8 text (byte 13); expected a text file of image paths, one a line"
    )


def _voc(tmp_path: Path, lists: dict[str, str], images: int = 3) -> Path:
    raw = tmp_path / "voc"
    if images:
        make_synthetic_folder(tmp_path / "imgs", images, classes=1, size=(16, 16), seed=1)
        (raw / "JPEGImages").mkdir(parents=True)
        for k, p in enumerate(sorted((tmp_path / "imgs").rglob("*.jpg"))):
            shutil.copy(p, raw / "JPEGImages" / f"im{k}.jpg")
    (raw / "ImageSets" / "Main").mkdir(parents=True)
    for name, text in lists.items():
        (raw / "ImageSets" / "Main" / f"{name}.txt").write_bytes(text.encode("latin-1"))
    return raw


@pytest.mark.parametrize("lists", [("val", "trainval"), ("train", "trainval"), ("trainval", "test")])
def test_voc_trainval_is_a_split_unless_train_and_val_are_both_there(tmp_path, recwarn, lists):
    raw = _voc(tmp_path, {name: "im0\nim1\n" for name in lists})
    found = find_splits(raw, "voc")
    assert set(_raws(found)) == set(lists)
    assert found["trainval"].only == ("JPEGImages/im0.jpg", "JPEGImages/im1.jpg")
    assert not [w for w in recwarn if "trainval" in str(w.message)]


def test_voc_trainval_beside_train_and_val_is_said_once(tmp_path):
    raw = _voc(tmp_path, {"train": "im0\n", "val": "im1\n", "trainval": "im0\nim1\n"})
    with pytest.warns(UserWarning) as got:
        found = find_splits(raw, "voc")
    assert list(found) == ["train", "val"]
    assert [str(w.message) for w in got] == [
        f"{raw}/ImageSets/Main/trainval.txt is train.txt and val.txt together: not built as a split of its "
        "own (its images are in the train and val caches)"
    ]


def test_voc_lists_without_jpegimages_report_every_id(tmp_path):
    raw = _voc(tmp_path, {"train": "a\nb 1\n", "val": "c\n"}, images=0)
    found = find_splits(raw, "voc")
    assert found["train"].only == () and found["train"].missing == (
        ("ImageSets/Main/train.txt: a", f"no image JPEGImages/a.* in {raw}"),
        ("ImageSets/Main/train.txt: b", f"no image JPEGImages/b.* in {raw}"),
    )


def test_a_voc_image_set_that_does_not_read_is_one_line(tmp_path):
    raw = _voc(tmp_path, {"train": "im0\n\xff\n", "val": "im1\n"})
    with pytest.raises(UsageError) as err:
        find_splits(raw, "voc")
    assert str(err.value) == (
        f"an image set {raw}/ImageSets/Main/train.txt is not UTF-8 text (byte 4); expected a text file of "
        "image ids, one a line"
    )


def test_a_split_out_is_a_folder_or_a_url_below_out():
    assert split_out("s3://bucket/BOX//", "train") == "s3://bucket/BOX/train"
    assert split_out("cache//", "val") == "cache//val"


def test_split_folders_beside_hidden_folders_and_holding_other_files(tmp_path):
    root = tmp_path / "raw"
    for split in ("train", "val"):
        make_synthetic_folder(root / split, 2, classes=1, size=(16, 16), seed=1)
    (root / ".git").mkdir()
    (root / "train" / "notes.txt").write_text("not a parquet file\n")
    found = find_splits(root)
    assert _raws(found) == {"train": f"{root}/train", "val": f"{root}/val"}
    assert {s.origin for s in found.values()} == {f"the folders of {root}"}


def test_yolo_splits_name_their_data_yaml_and_origin(tmp_path):
    raw = _yolo(tmp_path / "a", "train: images/train\nval: images/val\n")
    found = find_splits(raw, "yolo")
    assert {(s.name, s.annotations, s.origin) for s in found.values()} == {
        (n, f"{raw}/data.yaml", "data.yaml's train/val/test") for n in ("train", "val")
    }
    (raw / "data.yaml").unlink()  # no data.yaml: images/<split>/ folders, --annotations as given
    found = find_splits(raw, "yolo")
    assert {(s.name, s.raw, s.annotations, s.origin) for s in found.values()} == {
        (n, f"{raw}/images/{n}", "yolo", f"the folders of {raw}/images") for n in ("train", "val")
    }
    other = tmp_path / "elsewhere.yaml"  # a data.yaml named by its path, outside RAW
    other.write_text(f"path: {raw}\ntrain: images/train\nval: images/val\n")
    assert {s.annotations for s in find_splits(raw, str(other)).values()} == {str(other)}


def test_yolo_lists_name_their_origin_and_absolute_entries(tmp_path):
    raw = _yolo(tmp_path / "a", "")
    (raw / "train.txt").write_text("images/train/x.jpg\n")
    val = raw / "images" / "val"
    (raw / "data.yaml").write_text(f"train: train.txt\nval: [{val}, {raw / 'images' / 'train'}]\n")
    found = find_splits(raw, "yolo")
    assert (found["train"].name, found["train"].only, found["train"].annotations) == (
        "train",
        ("images/train/x.jpg",),
        f"{raw}/data.yaml",
    )
    assert found["val"].only == ("images/val", "images/train")
    assert {s.origin for s in found.values()} == {"data.yaml's train/val/test"}
    (raw / "data.yaml").write_text("train: train.txt\n")  # one split, but a list: not every image
    assert list(find_splits(raw, "yolo")) == ["train"]
    (raw / "data.yaml").write_text("train: [images/train, train.csv]\n")
    (raw / "train.csv").write_text("images/train/x.jpg\n")
    with pytest.raises(UsageError) as err:
        find_splits(raw, "yolo")
    assert (
        str(err.value) == f"{raw}/data.yaml: train: train.csv is neither a folder nor a .txt file of images"
    )


def test_a_single_split_of_every_image_is_the_dataset_wherever_path_puts_it(tmp_path):
    raw = _yolo(tmp_path / "a", "path: ds\ntrain: images\n", where="ds")
    assert find_splits(raw, "yolo") is None
    raw = _yolo(tmp_path / "b", f"path: {tmp_path / 'a'}\ntrain: {tmp_path / 'b' / 'images'}\n")
    assert find_splits(raw, "yolo") is None


def test_a_data_yaml_without_splits_and_images_not_all_splits_names_none(tmp_path):
    raw = _yolo(tmp_path / "a", "- train\n- val\n")  # a list, not a mapping: it names nothing
    assert set(find_splits(raw, "yolo")) == {"train", "val"}  # images/<split>/ still do
    make_synthetic_folder(raw / "images" / "cats", 1, classes=1, size=(16, 16), seed=3)
    assert find_splits(raw, "yolo") is None


def test_a_data_yaml_that_is_not_yaml_or_nested_too_deep_is_one_line(tmp_path):
    import yaml

    raw = _yolo(tmp_path / "a", "")
    bad = "train: [images/train, " + "x" * 300 + "\n" + "v" * 120 + ": }\n"
    (raw / "data.yaml").write_text(bad)
    try:
        yaml.safe_load(bad)
    except yaml.YAMLError as exc:
        why = " ".join(str(exc).split())
    assert len(why) > 200
    with pytest.raises(UsageError) as err:
        find_splits(raw, "yolo")
    assert str(err.value) == f"{raw}/data.yaml: not valid YAML ({why[:200]})"
    (raw / "data.yaml").write_text("train: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(UsageError) as err:
        find_splits(raw, "yolo")
    assert str(err.value) == f"{raw}/data.yaml: nested too deep to be a data.yaml"


def test_split_names_picked_from_a_string_or_a_list(parquet, tmp_path):
    repo = _files(parquet, tmp_path, ["train-0.parquet", "val-0.parquet", "test-0.parquet"])
    found = find_splits(f"{repo}/*.parquet")
    assert list(pick_splits(found, " test , train,", repo)) == ["train", "test"]
    assert list(pick_splits(found, ["val"], repo)) == ["val"]
    assert pick_splits(found, None, repo) == found
    for nothing in ("", " , ", []):
        with pytest.raises(UsageError) as err:
            pick_splits(found, nothing, repo)
        assert str(err.value) == "--split names no split (give NAME[,NAME...])"
    with pytest.raises(UsageError, match=r"^--split x,y: "):
        pick_splits(found, "x,train,y", repo)


def test_only_a_folder_or_files_of_records_without_annotations_name_splits(parquet, tmp_path):
    repo = _files(parquet, tmp_path, ["train-0.parquet", "test-0.parquet"])
    assert find_splits(f"{repo}/*.parquet", annotations=str(repo / "coco.json")) is None
    assert find_splits(str(repo / "train-0.parquet")) is None  # one file: one split at most
    (repo / "a.jpg").write_bytes(b"")
    assert find_splits(str(repo / "a.jpg")) is None
