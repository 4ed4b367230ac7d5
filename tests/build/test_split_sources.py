"""``ds.source(i)`` is relative to the RAW given to ``cachekit build``, for every layout and every split:
``os.path.join(raw, ds.source(i))`` is the very file (or, for Parquet rows and tar members, the file
holding the row or member) the sample was decoded from, as docs/TRAINING.md says. A cache written
before splits recorded their folder keeps reading as it did; a folder that is not relative is one line."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from sourcekit import make_objects, write_parquet, write_tars, write_voc

from cachekit import CachedDataset
from cachekit.cli import main
from cachekit.errors import CacheError
from cachekit.tools.synthetic import make_synthetic_folder
from cachekit.tools.synthetic_objects import make_object_dataset, object_classes

NAMES = "".join(f"  {i}: {n}\n" for i, n in enumerate(object_classes(3)))


def _yolo_parts(tmp: Path, raw: Path, counts: dict[str, int]) -> None:
    """``raw/images/<split>/`` and ``raw/labels/<split>/``, the images named as in no other split."""
    for k, (split, n) in enumerate(counts.items()):
        part = make_object_dataset(tmp / f"part-{split}", n, size=(40, 52), classes=3, seed=k)
        for kind in ("images", "labels"):
            (raw / kind / split).mkdir(parents=True)
            for p in sorted((part / kind).iterdir()):
                shutil.copy(p, raw / kind / split / f"{split}_{p.name}")


def imagefolder(tmp: Path) -> tuple[Path, list[str]]:
    raw = tmp / "raw"
    make_synthetic_folder(raw / "train", 4, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "val", 2, classes=2, size=(32, 40), seed=2)
    return raw, []


def imagefolder_cased(tmp: Path) -> tuple[Path, list[str]]:
    """Split folders named in another case (``Train/``): the split is ``train``, the path ``Train/...``."""
    raw = tmp / "raw"
    make_synthetic_folder(raw / "Train", 4, classes=2, size=(32, 40), seed=1)
    make_synthetic_folder(raw / "Val", 2, classes=2, size=(32, 40), seed=2)
    return raw, []


def yolo_folders(tmp: Path) -> tuple[Path, list[str]]:
    raw = tmp / "raw"
    _yolo_parts(tmp, raw, {"train": 3, "val": 2})
    return raw, ["--annotations", "yolo"]


def yolo_yaml(tmp: Path) -> tuple[Path, list[str]]:
    raw = tmp / "raw"
    _yolo_parts(tmp, raw, {"train": 3, "val": 2})
    (raw / "data.yaml").write_text(f"path: .\ntrain: images/train\nval: images/val\nnames:\n{NAMES}")
    return raw, ["--annotations", "yolo"]


def yolo_lists(tmp: Path) -> tuple[Path, list[str]]:
    raw = tmp / "raw"
    _yolo_parts(tmp, raw, {"train": 3, "val": 2})
    for split in ("train", "val"):
        listed = sorted((raw / "images" / split).iterdir())
        (raw / f"{split}.txt").write_text("".join(f"./images/{split}/{p.name}\n" for p in listed))
    (raw / "data.yaml").write_text(f"path: .\ntrain: train.txt\nval: [val.txt]\nnames:\n{NAMES}")
    return raw, ["--annotations", "yolo"]


def yolo_elsewhere(tmp: Path) -> tuple[Path, list[str]]:
    """A RAW holding only a data.yaml whose ``path:`` is another folder: paths lead there from RAW."""
    data = tmp / "data"
    _yolo_parts(tmp, data, {"train": 3, "val": 2})
    raw = tmp / "raw"
    raw.mkdir()
    (raw / "data.yaml").write_text(f"path: {data}\ntrain: images/train\nval: images/val\nnames:\n{NAMES}")
    return raw, ["--annotations", "yolo"]


def coco(tmp: Path) -> tuple[Path, list[str]]:
    raw = make_object_dataset(tmp / "raw", 4, size=(40, 52), classes=3)
    return raw, ["--annotations", str(raw / "coco.json")]


def voc(tmp: Path) -> tuple[Path, list[str]]:
    _, items = make_objects(tmp / "objects", 5)
    raw = write_voc(items, tmp / "raw")
    (raw / "ImageSets" / "Main").mkdir(parents=True)
    ids = sorted(p.stem for p in (raw / "JPEGImages").iterdir())
    (raw / "ImageSets" / "Main" / "train.txt").write_text("".join(f"{i}\n" for i in ids[:3]))
    (raw / "ImageSets" / "Main" / "val.txt").write_text("".join(f"{i}\n" for i in ids[3:]))
    return raw, ["--annotations", "voc"]


def parquet_repo(tmp: Path) -> tuple[Path, list[str]]:
    _, items = make_objects(tmp / "objects", 7)
    raw = tmp / "raw"
    write_parquet(items[:5], raw / "data", files=2)
    write_parquet(items[5:], tmp / "t", files=1)
    (tmp / "t" / "train-00000.parquet").rename(raw / "data" / "test-00000-of-00001.parquet")
    return raw, ["--box-format", "xywh"]


def parquet_folders(tmp: Path) -> tuple[Path, list[str]]:
    _, items = make_objects(tmp / "objects", 6)
    raw = tmp / "raw"
    write_parquet(items[:4], raw / "train", files=2)
    write_parquet(items[4:], raw / "validation", files=1)
    return raw, ["--box-format", "xywh"]


def tars(tmp: Path) -> tuple[Path, list[str]]:
    _, items = make_objects(tmp / "objects", 6)
    raw = tmp / "raw"
    write_tars(items, raw, files=3)
    (raw / "train-000002.tar").rename(raw / "test-000000.tar")
    return raw, ["--box-format", "xywh"]


def tar_folders(tmp: Path) -> tuple[Path, list[str]]:
    _, items = make_objects(tmp / "objects", 6)
    raw = tmp / "raw"
    write_tars(items[:4], raw / "train", files=2)
    write_tars(items[4:], raw / "val", files=1)
    return raw, ["--box-format", "xywh"]


#: Each layout, and the first folder of every split's sources (a split's own folder within RAW).
LAYOUTS = {
    imagefolder: {"train": "train/", "val": "val/"},
    imagefolder_cased: {"train": "Train/", "val": "Val/"},
    yolo_folders: {"train": "images/train/", "val": "images/val/"},
    yolo_yaml: {"train": "images/train/", "val": "images/val/"},
    yolo_lists: {"train": "images/train/", "val": "images/val/"},
    yolo_elsewhere: {"train": "../data/images/train/", "val": "../data/images/val/"},
    coco: {"": "images/"},
    voc: {"train": "JPEGImages/", "val": "JPEGImages/"},
    parquet_repo: {"train": "data/train-", "test": "data/test-"},
    parquet_folders: {"train": "train/train-", "validation": "validation/train-"},
    tars: {"train": "train-", "test": "test-"},
    tar_folders: {"train": "train/train-", "val": "val/train-"},
}


def _raw_pixels(raw: Path, source: str) -> np.ndarray:
    """The RGB pixels ``source`` names under ``raw``: a file, a Parquet row or a tar member."""
    if ".parquet/" in source:
        import pyarrow.parquet as pq

        name, group, row = source.rsplit("/", 2)
        data = pq.ParquetFile(os.path.join(raw, name)).read_row_group(int(group)).column("image")[int(row)]
        data = data.as_py()["bytes"]
    elif ".tar/" in source:
        name, member = source.split(".tar/", 1)
        with tarfile.open(os.path.join(raw, f"{name}.tar")) as tar:
            data = tar.extractfile(member).read()
    else:
        data = Path(os.path.join(raw, source)).read_bytes()
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]


def _build(make, tmp: Path) -> tuple[Path, Path]:
    raw, args = make(tmp)
    out = tmp / "cache"
    result = CliRunner().invoke(
        main, ["build", str(raw), "--out", str(out), "--pipeline", "none", "--quiet", *args]
    )
    assert result.exit_code == 0, result.output
    return raw, out


@pytest.mark.parametrize("make", list(LAYOUTS), ids=[f.__name__ for f in LAYOUTS])
def test_each_sources_path_joins_the_raw_folder_given_to_build(make, tmp_path):
    if make in (parquet_repo, parquet_folders):
        pytest.importorskip("pyarrow")
    raw, out = _build(make, tmp_path)
    built = sorted(p.name for p in out.iterdir() if (p / "manifest.json").is_file())
    assert built == sorted(n for n in LAYOUTS[make] if n)  # one cache per split, or one cache
    assert (out / "manifest.json").is_file() == ("" in LAYOUTS[make])
    for split, head in LAYOUTS[make].items():
        ds = CachedDataset(out / split if split else out)
        assert len(ds) > 0
        for i in range(len(ds)):
            source = ds.source(i)
            assert source.startswith(head), (split, source)
            want = _raw_pixels(raw, source)
            assert np.array_equal(ds[i][0].permute(1, 2, 0).numpy(), want), (split, source)


def test_a_split_cache_written_before_the_prefix_reads_as_it_did(tmp_path):
    raw, out = _build(yolo_folders, tmp_path)
    manifest_path = out / "val" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["source"]["prefix"] == "images/val"
    first = CachedDataset(out / "val").source(0)
    del manifest["source"]["prefix"]  # what a build of an earlier version wrote
    manifest_path.write_text(json.dumps(manifest))
    assert CachedDataset(out / "val").source(0) == first.removeprefix("images/val/")
    for bad in ("/etc", "images/val/", 7, "a\0b", "x" * 5000):
        manifest["source"]["prefix"] = bad
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(CacheError, match=r"manifest.json: source.prefix .* is not a relative folder$"):
            CachedDataset(out / "val").source(0)
