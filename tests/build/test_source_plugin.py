"""A new source kind is one module and one row of ``sources.layouts.LAYOUTS``: this file is the module
(a "numbered folder": ``classes.txt`` beside ``<class number>-<name>.png`` images), its row is
registered, and a cache built from it is read back. The table's other readers (detection, splits,
class names, bench, the fast-decode guard) are checked against its rows here too."""

from __future__ import annotations

import sys
from dataclasses import replace

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, read_manifest
from cachekit.build.sources import discover as discover_folder
from cachekit.build.sources import layouts
from cachekit.build.sources.base import SourceKind
from cachekit.build.sources.classnames import with_class_order
from cachekit.build.sources.inputtable import Source, local_folder, nonempty, table
from cachekit.build.sources.layouts import LISTED, NUMBERED, Layout, Request, detect, register, unregister
from cachekit.build.sources.records import RecordReader
from cachekit.build.splits import find_splits
from cachekit.errors import UsageError
from cachekit.tools.benchsamples import raw_discovery

QUIET = {"workers": 1, "progress": False, "size": 32}
NAMES = ["red", "green", "blue"]
COLOURS = {0: (255, 0, 0), 1: (0, 255, 0), 2: (0, 0, 255)}  # RGB


def discover(request: Request) -> Source:
    """The images of a numbered folder: each ``<k>-<name>.png``'s class is ``k``, named by line ``k`` of
    ``classes.txt``; a name without a known number is left out, with its reason."""
    root = local_folder(request.text)
    names = [n.strip() for n in (root / "classes.txt").read_text().splitlines() if n.strip()]
    rows, ignored = [], []
    for path in sorted(root.glob("*.png")):
        head = path.name.split("-", 1)[0]
        if not head.isdigit() or int(head) >= len(names):
            ignored.append((path.name, "no class number in its name"))
            continue
        st = path.stat()
        rows.append((path.name, int(head), st.st_size, st.st_mtime_ns))
    return nonempty(table(root, NUMBERED_FOLDER.name, rows, names, ignored, {}))


def _is_numbered(request: Request) -> bool:
    return request.local_dir and (local_folder(request.text) / "classes.txt").is_file()


NUMBERED_FOLDER = Layout(
    "numbered",
    "a folder with classes.txt and <class number>-<name>.png images",
    _is_numbered,
    sys.modules[__name__],
    None,
    LISTED,
    layouts.BENCH_FILES,
    True,
)


@pytest.fixture
def numbered():
    register(NUMBERED_FOLDER)
    yield NUMBERED_FOLDER
    unregister(NUMBERED_FOLDER.name)


@pytest.fixture
def numbered_raw(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "classes.txt").write_text("\n".join(NAMES) + "\n")
    rng = np.random.default_rng(0)
    for k, name in [(2, "a"), (0, "b"), (1, "c"), (2, "d"), (0, "e")]:
        rgb = np.full((40, 40, 3), COLOURS[k], dtype=np.uint8)
        rgb[rng.integers(0, 40), :] = 128  # a line: the images differ, their colour says the class
        cv2.imwrite(str(raw / f"{k}-{name}.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    cv2.imwrite(str(raw / "x-loose.png"), np.zeros((8, 8, 3), np.uint8))
    return raw


def test_a_new_kind_is_one_module_and_one_row(numbered, numbered_raw, tmp_path):
    out = tmp_path / "cache"
    build(numbered_raw, out, BuildConfig(**QUIET))
    ds = CachedDataset(out)
    assert ds.classes == NAMES
    assert sorted(ds.source(i) for i in range(len(ds))) == ["0-b.png", "0-e.png", "1-c.png", "2-a.png", "2-d.png"]
    for i in range(len(ds)):
        image, label = ds[i]
        k = int(ds.source(i).split("-")[0])
        assert label == k
        pixels = image.numpy().reshape(3, -1)
        mode = [int(np.bincount(ch).argmax()) for ch in pixels]  # the colour most pixels have
        assert np.abs(np.array(mode) - COLOURS[k]).max() <= 2, (ds.source(i), mode)
    manifest = read_manifest(out)
    assert manifest.source["layout"] == "numbered"
    assert [(s.path, s.reason) for s in manifest.skipped] == [("x-loose.png", "no class number in its name")]


def test_without_its_row_the_same_folder_is_a_flat_folder(numbered_raw):
    source = discover_folder(numbered_raw)
    assert source.layout == "flat" and source.classes == () and set(source.labels.tolist()) == {-1}


def test_the_row_is_found_by_detection_and_by_folder_discovery(numbered, numbered_raw):
    assert detect(Request(numbered_raw)) is numbered
    source = discover_folder(numbered_raw)
    assert source.layout == "numbered" and source.labels.tolist() == [0, 0, 1, 2, 2]
    with pytest.raises(ValueError, match="already in the table"):
        register(NUMBERED_FOLDER)
    assert layouts.LAYOUTS.index(numbered) == layouts.LAYOUTS.index(layouts.IMAGEFOLDER) - 1


def test_the_fast_decode_guard_reads_the_row(numbered, numbered_raw, tmp_path):
    build(numbered_raw, tmp_path / "ok", BuildConfig(fast_decode=True, **QUIET))
    unregister(numbered.name)
    register(replace(numbered, fast_decode=False))
    with pytest.raises(UsageError, match="--fast-decode"):
        build(numbered_raw, tmp_path / "refused", BuildConfig(fast_decode=True, **QUIET))


def test_the_class_name_rule_reads_the_row(numbered, numbered_raw):
    source = discover_folder(numbered_raw)
    renamed = with_class_order(source, ("blue", "red", "green"), "names.txt")
    assert renamed.labels.tolist() == [1, 1, 2, 0, 0]  # listed names: each class moves to its line
    unregister(numbered.name)
    register(replace(numbered, class_names=NUMBERED))
    numbered_source = replace(source, classes=("0", "1", "2"))
    kept = with_class_order(numbered_source, ("blue", "red", "green"), "names.txt")
    assert kept.labels.tolist() == [0, 0, 1, 2, 2] and kept.classes == ("blue", "red", "green")


def test_splits_follow_the_row(numbered, numbered_raw, tmp_path):
    for split in ("train", "val"):
        (numbered_raw / split / "any").mkdir(parents=True)
        cv2.imwrite(str(numbered_raw / split / "any" / "a.png"), np.zeros((8, 8, 3), np.uint8))
    assert find_splits(numbered_raw) is None  # its row names no split rule
    unregister(numbered.name)
    with pytest.warns(UserWarning, match="are in no split"):  # an ImageFolder root of split folders
        assert set(find_splits(numbered_raw)) == {"train", "val"}


@pytest.mark.parametrize(
    ("raw", "options", "name"),
    [
        ("data/train-*.parquet", {}, "parquet"),
        ("s3://bucket/shards/{000..009}.tar", {}, "webdataset"),
        ("RAW", {"annotations": "voc"}, "voc"),
        ("RAW", {"annotations": "yolo"}, "yolo"),
        ("RAW", {"annotations": "RAW/data.YAML"}, "yolo"),
        ("RAW", {"annotations": "RAW/coco.json"}, "coco"),
        ("s3://bucket/raw", {}, "objectstore"),
        ("s3://bucket/raw", {"labels": "labels.csv"}, "objectstore"),
        ("RAW", {"labels": "labels.csv"}, "csv"),
        ("RAW", {}, "imagefolder"),
    ],
)
def test_each_built_in_kind_is_detected_by_its_row(raw, options, name, tmp_path):
    raw = str(tmp_path / raw) if raw == "RAW" else raw
    options = {k: v.replace("RAW", str(tmp_path)) for k, v in options.items()}
    assert detect(Request(raw, **options)).name == name


def test_objects_and_folders_named_like_files_of_records(tmp_path):
    class Items:
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return i

    assert detect(Request(Items())).name == "dataset"
    assert detect(Request(iter([1]))).name == "stream"
    assert detect(Request(object())) is None
    (tmp_path / "x.parquet").mkdir()
    assert detect(Request(str(tmp_path / "x.parquet"))).name == "imagefolder"  # a folder, whatever its name
    assert detect(Request(str(tmp_path / "x.parquet")), folders_only=True).name == "imagefolder"
    assert detect(Request("a/*.parquet"), folders_only=True).name == "imagefolder"
    assert layouts.record_files_kind("a/B.TAR") == "tar" and layouts.record_files_kind("a.jpg") is None


def test_bench_reads_raw_inputs_as_the_row_says(tmp_path):
    class Manifest:
        def __init__(self, **source):
            self.source = source

    assert raw_discovery(Manifest(layout="yolo", annotations="yolo"), tmp_path) == {"annotations": "yolo"}
    coco = raw_discovery(Manifest(layout="coco", annotations="coco.json"), tmp_path)
    assert coco == {"annotations": str(tmp_path / "coco.json")}
    pq = raw_discovery(Manifest(layout="parquet", columns={"image": "img"}, box_format="xywh"), tmp_path)
    assert pq == {"source": {"columns": {"image": "img"}, "box_format": "xywh"}}
    assert raw_discovery(Manifest(layout="voc", annotations="voc"), tmp_path) == {}
    assert raw_discovery(Manifest(layout="imagefolder"), tmp_path) == {}


def test_every_module_of_the_table_keeps_the_contract():
    for row in layouts.LAYOUTS:
        assert isinstance(row.module(), SourceKind), row.name
        assert row.module().__name__.startswith("cachekit.build.sources."), row.name
    from cachekit.build.sources.iterable import ChunkReader, StreamReader
    from cachekit.build.sources.parquet import ParquetReader
    from cachekit.build.sources.pydataset import DatasetReader
    from cachekit.build.sources.webdataset import TarReader

    for reader in (ChunkReader, StreamReader, ParquetReader, DatasetReader, TarReader):
        assert hasattr(reader, "sequential") and callable(reader.open), reader
    assert not isinstance(object(), RecordReader)
