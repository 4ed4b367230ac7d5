"""Splits beyond the first cut: images beside the split folders are reported, a dask build builds
every split, a killed build resumes split by split, and VOC's ImageSets/Main lists name splits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sourcekit import make_objects, write_voc

from cachekit import BuildConfig, CachedDataset, build
from cachekit.cli import main
from cachekit.constants import PARTIAL_DIR
from cachekit.tools.synthetic import make_synthetic_folder

QUIET = {"progress": False, "workers": 1}


def _sources(cache: Path) -> list[str]:
    ds = CachedDataset(cache)
    return sorted(ds.source(i) for i in range(len(ds)))


def _split_tree(raw: Path, train: int = 6, val: int = 3) -> Path:
    make_synthetic_folder(raw / "train", train, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", val, classes=2, size=(32, 40), seed=2)
    return raw


def test_images_beside_the_split_folders_are_reported(tmp_path):
    raw = _split_tree(tmp_path / "raw")
    first = sorted((raw / "train" / "class_000").iterdir())
    for k, name in enumerate(["d.jpg", "a.png", "c.JPG", "b.jpeg"]):
        shutil.copy(first[k % len(first)], raw / name)
    (raw / "notes.txt").write_text("not an image")
    shutil.copy(first[0], raw / ".hidden.jpg")  # hidden files are no inputs anywhere
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(tmp_path / "c"), "--pipeline", "none", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "in no split" in line]
    assert lines == [
        f"warning: 4 images directly in {raw} are in no split (its folders train, val are the splits) "
        "and are left out: a.png, b.jpeg, c.JPG ..."
    ], result.stderr
    assert len(_sources(tmp_path / "c" / "train")) == 6 and len(_sources(tmp_path / "c" / "val")) == 3
    (raw / "c.JPG").unlink()
    with pytest.warns(UserWarning, match=r"^3 images directly in .* left out: a\.png, b\.jpeg, d\.jpg$"):
        build(raw, tmp_path / "d", BuildConfig(pipeline="none", **QUIET))


def test_images_beside_yolo_split_folders_are_reported(tmp_path):
    raw = tmp_path / "yolo"
    make_synthetic_folder(tmp_path / "src", 5, classes=1, size=(32, 40), seed=1)
    files = sorted((tmp_path / "src" / "class_000").iterdir())
    for split, chosen in (("train", files[:2]), ("val", files[2:4])):
        (raw / "images" / split).mkdir(parents=True)
        (raw / "labels" / split).mkdir(parents=True)  # background images: no label files
        for f in chosen:
            shutil.copy(f, raw / "images" / split / f.name)
    shutil.copy(files[4], raw / "images" / "loose.jpg")
    (raw / "data.yaml").write_text("names: [a]\n")  # no train/val keys: images/<split>/ name them
    with pytest.warns(UserWarning, match=r"^1 images directly in .*images are in no split .*: loose\.jpg$"):
        result = build(raw, tmp_path / "c", BuildConfig(annotations="yolo", pipeline="none", **QUIET))
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"train": 2, "val": 2}


def test_split_folders_alone_warn_of_nothing(tmp_path, recwarn):
    raw = _split_tree(tmp_path / "raw", 3, 2)
    (raw / "README.md").write_text("two splits")
    build(raw, tmp_path / "c", BuildConfig(pipeline="none", **QUIET))
    assert not [w for w in recwarn if "no split" in str(w.message)]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "manifest.json"}


def _same_cache(a: Path, b: Path) -> None:
    assert _files(a) == _files(b)
    assert CachedDataset(a).manifest.to_json() | {"created": ""} == CachedDataset(b).manifest.to_json() | {
        "created": ""
    }


@pytest.mark.slow
def test_a_dask_build_builds_every_split(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    raw = _split_tree(tmp_path / "raw", 7, 4)
    config = {"pipeline": "none", "shard_size": 3, "progress": False}
    local = build(raw, tmp_path / "local", BuildConfig(workers=2, **config))
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl,
        distributed.Client(cl),
    ):
        options = {"scheduler": cl.scheduler_address}
        remote = build(raw, tmp_path / "dask", BuildConfig(executor="dask", executor_options=options, **config))
    assert remote.splits == local.splits == ("train", "val")
    assert {n: r.manifest.num_samples for n, r in remote.results.items()} == {"train": 7, "val": 4}
    for split in ("train", "val"):
        assert len(CachedDataset(tmp_path / "dask" / split).manifest.shards) > 1
        _same_cache(tmp_path / "local" / split, tmp_path / "dask" / split)
    assert _sources(tmp_path / "dask" / "val") == _sources(tmp_path / "local" / "val")


def _finished_shards(out: Path) -> int:
    partial = out / PARTIAL_DIR
    return len(list(partial.glob("shard-*.json"))) if partial.is_dir() else 0


def test_a_build_killed_in_its_second_split_resumes_that_split_only(tmp_path):
    raw = tmp_path / "raw"
    make_synthetic_folder(raw / "train", 6, classes=2, size=(96, 128), seed=1)
    make_synthetic_folder(raw / "val", 40, classes=2, size=(96, 128), seed=2)
    args = ["--shard-size", "2", "--workers", "1", "--size", "48", "--quiet"]
    cmd = [sys.executable, "-m", "cachekit.cli", "build", str(raw), *args]
    fresh = subprocess.run([*cmd, "--out", str(tmp_path / "fresh")], capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr
    out = tmp_path / "out"
    proc = subprocess.Popen([*cmd, "--out", str(out)], start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if (out / "val" / PARTIAL_DIR / "state.json").exists() and _finished_shards(out / "val") >= 3:
            break
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)  # the build and its workers, as a crash would
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert (out / "train" / "manifest.json").exists() and not (out / "val" / "manifest.json").exists()
    train_manifest = (out / "train" / "manifest.json").read_bytes()
    train_stamp = (out / "train" / "manifest.json").stat().st_mtime_ns
    finished = _finished_shards(out / "val")
    assert 3 <= finished < 20

    again = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0].startswith("up to date: 6 samples"), again.stdout  # train: not rebuilt
    assert lines[1].startswith("resumed: 40 samples") and f"({finished} reused)" in lines[1], again.stdout
    assert (out / "train" / "manifest.json").read_bytes() == train_manifest
    assert (out / "train" / "manifest.json").stat().st_mtime_ns == train_stamp
    for split in ("train", "val"):
        _same_cache(tmp_path / "fresh" / split, out / split)  # no records or temp files left behind
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]


def _targets(cache: Path) -> dict[str, tuple]:
    """Each sample's (classes, boxes) by its source path."""
    ds = CachedDataset(cache)
    out = {}
    for i in range(len(ds)):
        target = ds[i][1]
        out[ds.source(i)] = (target["classes"].tolist(), target["boxes"].tolist())
    return out


def _voc_tree(tmp_path: Path, lists: dict[str, list[int]]) -> tuple[Path, list[str]]:
    """A VOC tree of 8 images (whole, built as one cache at tmp_path/whole) and ImageSets/Main lists
    of the given image numbers."""
    _, items = make_objects(tmp_path / "objects", 8)
    raw = write_voc(items, tmp_path / "voc")
    build(raw, tmp_path / "whole", BuildConfig(annotations="voc", pipeline="none", **QUIET))
    ids = [Path(it.file).stem for it in items]
    (raw / "ImageSets" / "Main").mkdir(parents=True)
    for name, numbers in lists.items():
        text = "".join(f"{ids[k]}\n" for k in numbers)
        (raw / "ImageSets" / "Main" / f"{name}.txt").write_text(text)
    return raw, ids


def test_voc_image_sets_build_train_and_val(tmp_path):
    raw, ids = _voc_tree(tmp_path, {"train": [0, 2, 3, 5, 7, 0], "val": [1, 4, 6], "trainval": list(range(8))})
    (raw / "ImageSets" / "Main" / "cat_train.txt").write_text(f"{ids[0]}  1\n")  # a class's list: no split
    out = tmp_path / "c"
    args = ["build", str(raw), "--out", str(out), "--annotations", "voc", "--pipeline", "none", "--quiet"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["train", "val"]
    assert _sources(out / "train") == [f"JPEGImages/{ids[k]}.png" for k in (0, 2, 3, 5, 7)]
    assert _sources(out / "val") == [f"JPEGImages/{ids[k]}.png" for k in (1, 4, 6)]
    warning = [line for line in result.stderr.splitlines() if "trainval" in line]
    assert len(warning) == 1 and warning[0].startswith("warning: ") and "not built as a split" in warning[0]
    assert "more than one split" not in result.stderr
    whole = _targets(tmp_path / "whole")
    for split in ("train", "val"):
        assert CachedDataset(out / split).manifest.classes == CachedDataset(tmp_path / "whole").manifest.classes
        for source, target in _targets(out / split).items():
            assert target == whole[source]  # each image's own boxes, as a build of the whole tree
    with pytest.warns(UserWarning, match="trainval.txt is train.txt and val.txt together"):
        val = build(raw, tmp_path / "v", BuildConfig(annotations="voc", pipeline="none", split="val", **QUIET))
    assert val.splits == ("val",) and not (tmp_path / "v" / "train").exists()


def test_voc_trainval_without_train_and_val_is_a_split(tmp_path, recwarn):
    raw, ids = _voc_tree(tmp_path, {"trainval": [0, 1, 2, 3, 4], "test": [5, 6, 7]})
    (raw / "ImageSets" / "Main" / "test.txt").write_text(f"{ids[5]}\n{ids[6]}\n{ids[7]}\nnot_there\n\n")
    (raw / "Annotations" / f"{ids[6]}.xml").unlink()  # an image without its annotation file
    result = build(raw, tmp_path / "c", BuildConfig(annotations="voc", pipeline="none", **QUIET))
    assert {n: r.manifest.num_samples for n, r in result.results.items()} == {"test": 2, "trainval": 5}
    skipped = [(s.path, s.reason) for s in result["test"].manifest.skipped]
    assert skipped == [
        ("ImageSets/Main/test.txt: not_there", f"no image JPEGImages/not_there.* in {raw}"),
        (
            f"JPEGImages/{ids[6]}.png",
            f"listed by {raw}/ImageSets/Main's lists but not an image of {raw}/JPEGImages with an "
            "Annotations/ file",
        ),
    ]
    assert not [w for w in recwarn if "trainval" in str(w.message)]
    (raw / "ImageSets" / "Main" / "test.txt").unlink()
    (raw / "ImageSets" / "Main" / "trainval.txt").unlink()
    plain = build(raw, tmp_path / "d", BuildConfig(annotations="voc", pipeline="none", **QUIET))
    assert plain.manifest.num_samples == 7  # no lists: one cache of every annotated image, as before
