"""Split folders are named in any case, as Parquet files are: ``Train/`` and ``Val/`` are the splits
train and val, never two classes of one cache; ``train/`` beside ``Train/`` is one line, not a
merge. A split is built into ``OUT/<split>``, a folder of its own: a symbolic link planted there is
refused in one line, as the readers refuse to open a split through one, and nothing is written
through it."""

from __future__ import annotations

import os
import shutil

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, CachedDataset, build
from cachekit.cli import main
from cachekit.errors import UsageError
from cachekit.tools.synthetic import make_synthetic_folder

QUIET = {"progress": False, "workers": 1, "pipeline": "none"}


def _split_tree(raw, names=("Train", "Val"), counts=(5, 3)):
    """An ImageFolder tree per split folder: JPEGs of two classes, and one PNG in the first split."""
    for k, (name, n) in enumerate(zip(names, counts)):
        make_synthetic_folder(raw / name, n, classes=2, size=(32, 40), seed=k + 1)
    png = np.random.default_rng(0).integers(0, 256, (30, 36, 3), dtype=np.uint8)
    cv2.imwrite(str(raw / names[0] / "class_001" / "extra.png"), png)
    return raw


def _build(raw, out, *extra):
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(out), "--pipeline", "none", "--quiet", *extra]
    )
    return result.exit_code, result.output


def test_split_folders_in_any_case_are_the_splits_not_classes(tmp_path):
    raw = _split_tree(tmp_path / "raw")
    code, said = _build(raw, tmp_path / "c")
    assert code == 0, said
    assert sorted(os.listdir(tmp_path / "c")) == ["train", "val"]
    train, val = CachedDataset(tmp_path / "c" / "train"), CachedDataset(tmp_path / "c" / "val")
    assert train.manifest.classes == val.manifest.classes == ("class_000", "class_001")
    assert (len(train), len(val)) == (6, 3)  # the PNG too
    assert sorted(train[i][1] for i in range(len(train))) == [0, 0, 0, 1, 1, 1]
    assert CachedDataset(tmp_path / "c", split="val").manifest.num_samples == 3


def test_yolo_image_folders_in_any_case_are_the_splits(tmp_path):
    raw = tmp_path / "yolo"
    make_synthetic_folder(tmp_path / "src", 5, classes=1, size=(32, 40), seed=1)
    files = sorted((tmp_path / "src" / "class_000").iterdir())
    for split, chosen in (("TRAIN", files[:3]), ("Valid", files[3:])):
        (raw / "images" / split).mkdir(parents=True)
        (raw / "labels" / split).mkdir(parents=True)
        for f in chosen:
            shutil.copy(f, raw / "images" / split / f.name)
            (raw / "labels" / split / f"{f.stem}.txt").write_text("0 0.5 0.5 0.5 0.5\n")
    (raw / "data.yaml").write_text("names: [a]\n")  # no train/val keys: images/<split>/ name them
    result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", **QUIET))
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 3, "valid": 2}
    ds = CachedDataset(tmp_path / "c" / "valid")
    assert [len(ds[i][1]["boxes"]) for i in range(len(ds))] == [1, 1]


def test_two_folders_naming_one_split_in_two_cases_are_one_line(tmp_path):
    raw = _split_tree(tmp_path / "raw", ("train", "Train", "val"), (3, 2, 2))
    code, said = _build(raw, tmp_path / "c")
    assert code == 2
    assert (
        said.strip()
        == f"error: {raw}: the folders Train and train both name the split train: rename or remove one"
    )
    assert not (tmp_path / "c").exists()


def test_a_split_out_that_is_a_symbolic_link_is_refused_and_nothing_goes_through_it(tmp_path):
    raw = _split_tree(tmp_path / "raw", ("train", "val"))
    out, elsewhere = tmp_path / "c", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "train").symlink_to(elsewhere, target_is_directory=True)
    code, said = _build(raw, out)
    assert code == 2
    assert said.strip() == (
        f"error: {out / 'train'} is a symbolic link: a split's cache is written into a folder of its own, "
        "as readers open it; remove it or give another --out"
    )
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(out)) == ["train"]
    with pytest.raises(UsageError, match="is a symbolic link"):  # --split val alone is built
        build(raw, out, BuildConfig(**QUIET), split="train,val")
    assert build(raw, out, BuildConfig(**QUIET), split="val")["val"].manifest.num_samples == 3
    (out / "train").unlink()
    (out / "train").write_text("a file")
    code, said = _build(raw, out)
    assert code == 2 and f"{out / 'train'} is not a folder" in said
