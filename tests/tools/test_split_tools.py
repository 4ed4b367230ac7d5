"""bench, doctor and preview on a folder of split caches (a build of a RAW that names splits): one
split at a time, --split naming it, train by default for bench and doctor, and bench's raw rows
reading that split's inputs only."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, build
from cachekit.cli import main
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.tools.synthetic_objects import make_object_dataset

TRAIN, VAL = 6, 3


@pytest.fixture(scope="module")
def split_build(tmp_path_factory):
    """RAW with train/ and val/ folders of different sizes, and OUT/train, OUT/val built from it."""
    root = tmp_path_factory.mktemp("split-tools")
    raw = root / "raw"
    make_synthetic_folder(raw / "train", TRAIN, classes=2, size=(40, 48), seed=1)
    make_synthetic_folder(raw / "val", VAL, classes=2, size=(40, 48), seed=2)
    build(raw, root / "out", BuildConfig(pipeline="classification-224", progress=False, workers=1))
    return raw, root / "out"


def _run(*args):
    result = CliRunner().invoke(main, [*map(str, args)])
    return result.exit_code, result.stdout, result.stderr


BENCH = ("--raw-backends", "opencv", "--workers", "0", "--epochs", "1", "--batch-size", "2",
         "--warm-only", "--quiet")  # fmt: skip


def test_bench_takes_train_by_default_and_its_raw_inputs(split_build, tmp_path):
    raw, out = split_build
    code, stdout, err = _run("bench", raw, out, *BENCH, "--json", tmp_path / "r.json")
    assert code == 0, err
    assert f"{out} holds splits train, val: using train (--split NAME for another)" in err.splitlines()
    assert f"raw: split train of {raw}: {raw / 'train'}" in err.splitlines()
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["samples"] == TRAIN and result["raw"]["found"] == TRAIN
    assert result["raw"]["path"] == str(raw / "train")
    assert "matched by source path" in err and "Traceback" not in err


def test_bench_split_val_compares_val_with_val(split_build, tmp_path):
    raw, out = split_build
    code, _, err = _run("bench", raw, out, *BENCH, "--split", "val", "--json", tmp_path / "r.json")
    assert code == 0, err
    assert "using train" not in err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["samples"] == VAL and result["raw"]["found"] == VAL
    assert result["raw"]["path"] == str(raw / "val")
    # one split's cache given as it is, with RAW's split named: the same comparison
    code, _, err = _run("bench", raw, out / "val", *BENCH, "--json", tmp_path / "s.json")
    assert code == 0, err
    assert f"raw: split val of {raw}: {raw / 'val'}" in err.splitlines()
    assert json.loads((tmp_path / "s.json").read_text())["raw"]["found"] == VAL


def test_bench_refusals_are_one_line(split_build, tmp_path):
    raw, out = split_build
    code, _, err = _run("bench", "--synthetic", "4", "--split", "val")
    assert code == 2 and "--split picks a split of a CACHE given" in err
    code, _, err = _run("bench", raw, out, *BENCH, "--split", "test")
    assert code == 2 and err.strip() == f"error: {out}: no split 'test' (holds the splits train, val)"
    code, _, err = _run("bench", raw, out / "val", *BENCH, "--split", "val")
    assert code == 2 and "is one cache, not a folder of splits: leave out --split" in err
    only_val = tmp_path / "only-val"
    shutil.copytree(out / "val", only_val / "val")
    code, _, err = _run("bench", raw, only_val, *BENCH)
    assert code == 2
    assert err.strip() == f"error: {only_val} holds splits val, each a cache: give --split NAME (one of them)"
    test_raw = tmp_path / "raw-test"
    shutil.copytree(raw / "train", test_raw / "test")
    shutil.copytree(raw / "val", test_raw / "val")
    code, _, err = _run("bench", test_raw, out, *BENCH)
    assert code == 2 and "holds the splits val, test, not train" in err and "Traceback" not in err


def test_a_cache_named_as_a_split_raw_does_not_hold(split_build, tmp_path):
    raw, out = split_build
    other = tmp_path / "other"
    shutil.copytree(raw / "train", other / "test")  # RAW of test/ and val/: no train
    shutil.copytree(raw / "val", other / "val")
    code, _, err = _run("bench", other, out / "val", *BENCH, "--json", tmp_path / "r.json")
    assert code == 0, err  # OUT/val given as it is: RAW's val
    assert json.loads((tmp_path / "r.json").read_text())["raw"]["path"] == str(other / "val")
    code, _, err = _run("bench", other, out / "train", *BENCH, "--json", tmp_path / "s.json")
    assert code == 0, err  # a cache folder's name is a guess: RAW taken as given, no refusal
    assert "raw: split" not in err and json.loads((tmp_path / "s.json").read_text())["raw"]["path"] == str(other)


def test_bench_a_yolo_split(tmp_path):
    raw = tmp_path / "yolo"
    for k, (split, n) in enumerate({"train": 3, "val": 2}.items()):
        part = make_object_dataset(tmp_path / f"part-{split}", n, size=(40, 52), classes=2, seed=k)
        for kind in ("images", "labels"):
            shutil.copytree(part / kind, raw / kind / split)
    (raw / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: [a, b]\n")
    build(raw, tmp_path / "out", BuildConfig(annotations="yolo", size=48, progress=False, workers=1))
    code, _, err = _run("bench", raw, tmp_path / "out", *BENCH, "--split", "val", "--json", tmp_path / "r.json")
    assert code == 0, err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["raw"]["path"] == str(raw / "images" / "val") and result["samples"] == 2
    assert "matched by source path" in err


def test_doctor_on_a_folder_of_splits(split_build, tmp_path):
    _, out = split_build
    args = ("doctor", out, "--batch-size", "2", "--steps", "2", "--step-ms", "1", "--workers", "0")
    code, stdout, err = _run(*args, "--json", tmp_path / "d.json")
    assert code == 0, err
    assert err.splitlines()[0] == f"{out} holds splits train, val: using train (--split NAME for another)"
    assert json.loads((tmp_path / "d.json").read_text())["cache"] == str(out / "train")
    code, _, err = _run(*args, "--split", "val", "--json", tmp_path / "v.json")
    assert code == 0, err
    assert "using train" not in err
    assert json.loads((tmp_path / "v.json").read_text())["cache"] == str(out / "val")
    code, _, err = _run(*args, "--split", "nope")
    assert code == 2 and err.strip() == f"error: {out}: no split 'nope' (holds the splits train, val)"


def test_preview_needs_its_split_named(split_build, tmp_path):
    _, out = split_build
    code, _, err = _run("preview", out, "--out", tmp_path / "g.png")
    assert code == 2
    assert err.strip() == f"error: {out} holds splits train, val, each a cache: give --split NAME (one of them)"
    assert not (tmp_path / "g.png").exists()
    code, stdout, err = _run("preview", out, "--split", "val", "--out", tmp_path / "g.png", "-n", "16")
    assert code == 0, err
    assert f"({VAL} samples" in stdout and (tmp_path / "g.png").stat().st_size > 0
    code, stdout, err = _run("preview", out, "--split", "train", "--out", tmp_path / "t.png", "-n", "16")
    assert code == 0 and f"({TRAIN} samples" in stdout, err
