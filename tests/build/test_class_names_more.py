"""Class names, each rule at its edge: a names file's comments, limits and messages, VOC's palette
as its devkit defines it and as PNG files carry it, and ``--classes`` mapping every kind of target
(a numbered folder tree, YOLO boxes, a Python dataset's labels) by name."""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, UsageError, build
from cachekit.build.sources.classnames import VOC_CLASSES, _voc_colour, read_names_file, voc_palette_names

QUIET = {"workers": 1, "progress": False, "pipeline": "none"}

#: PASCAL VOC's colour map as its devkit publishes it: the 21 classes, then 255 ("void", object edges).
VOC_PUBLISHED = [
    (0, 0, 0), (128, 0, 0), (0, 128, 0), (128, 128, 0), (0, 0, 128), (128, 0, 128), (0, 128, 128),
    (128, 128, 128), (64, 0, 0), (192, 0, 0), (64, 128, 0), (192, 128, 0), (64, 0, 128), (192, 0, 128),
    (64, 128, 128), (192, 128, 128), (0, 64, 0), (128, 64, 0), (0, 192, 0), (128, 192, 0), (0, 64, 128),
]  # fmt: skip
VOID = (224, 224, 192)


# --- a names file -------------------------------------------------------------------------------


def test_a_names_file_leaves_out_blank_lines_and_indented_comments(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("# the classes\n\n  # an indented comment\n  cat  \ndog\n\t# another\n")
    assert read_names_file(path, "--classes") == ("cat", "dog")
    path.write_text("# nothing but comments\n\n")
    with pytest.raises(UsageError, match=rf"^--classes {path} names no class \(one name a line\)$"):
        read_names_file(path, "--classes")


def test_a_names_file_may_name_as_many_classes_as_a_cache_has_and_no_more(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("a\nb\nc\n")
    assert read_names_file(path, "--classes", most=3) == ("a", "b", "c")
    path.write_text("a\nb\nc\nd\n")
    with pytest.raises(UsageError, match=rf"^--classes {path} names 4 classes, over the 3 a cache may have$"):
        read_names_file(path, "--classes", most=3)


def test_a_names_file_that_is_missing_a_folder_or_too_large_is_one_line(tmp_path):
    with pytest.raises(UsageError, match=rf"^--mask-classes {tmp_path}/none.txt does not exist$"):
        read_names_file(tmp_path / "none.txt", "--mask-classes")
    with pytest.raises(
        UsageError, match=rf"^--classes {tmp_path} is a folder, not a text file of class names"
    ):
        read_names_file(tmp_path, "--classes")
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:  # one byte over the 64 MiB a names file may have (sparse: no disk)
        fh.truncate((64 << 20) + 1)
    with pytest.raises(UsageError, match=rf"is {(64 << 20) + 1} bytes, over the {64 << 20} it may have"):
        read_names_file(big, "--classes")


def test_names_given_as_a_list(tmp_path):
    assert read_names_file([" cat ", "dog"], "classes=") == ("cat", "dog")
    for bad in (["cat", ""], ["cat", "  "], ["cat", 3]):
        with pytest.raises(
            UsageError, match=r"^classes= as a list takes class names \(non-empty strings\), got \["
        ):
            read_names_file(bad, "classes=")
    with pytest.raises(UsageError, match=r"got \['cat', ''\]$"):
        read_names_file(("cat", ""), "classes=")
    with pytest.raises(UsageError, match=r"^classes= \['a', 'b', 'a'\] names 'a' twice$"):
        read_names_file(["a", "b", "a"], "classes=")


# --- VOC's palette ------------------------------------------------------------------------------


def test_the_voc_palette_is_the_devkits():
    assert [_voc_colour(i) for i in range(len(VOC_CLASSES))] == VOC_PUBLISHED
    assert _voc_colour(255) == VOID


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(colour_type: int, palette: list | None, *, data_first: bool = False, width: int = 2) -> bytes:
    """A real PNG of ``width`` x 2 pixels (8-bit; type 3: palette indices 0..3, type 2: RGB)."""
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", width, 2, 8, colour_type, 0, 0, 0))
    per_pixel = 3 if colour_type == 2 else 1
    rows = b"".join(b"\0" + bytes((x + y) % 4 for x in range(width * per_pixel)) for y in range(2))
    idat = _chunk(b"IDAT", zlib.compress(rows))
    plte = _chunk(b"PLTE", b"".join(bytes(c) for c in palette)) if palette is not None else b""
    body = idat + plte if data_first else plte + idat
    return b"\x89PNG\r\n\x1a\n" + ihdr + body + _chunk(b"IEND", b"")


def test_a_palette_png_with_vocs_colours_brings_vocs_names(tmp_path):
    small = _png(3, VOC_PUBLISHED)  # exactly VOC's 21 colours, in a file smaller than a full palette
    (tmp_path / "m.png").write_bytes(small)
    assert cv2.imread(str(tmp_path / "m.png"), cv2.IMREAD_UNCHANGED) is not None  # a PNG a decoder reads
    assert voc_palette_names(small) == VOC_CLASSES
    assert voc_palette_names(small[: 33 + 12 + 63]) == VOC_CLASSES  # read up to the palette only
    full = [*VOC_PUBLISHED, *[(i, i, i) for i in range(21, 255)], VOID]
    assert voc_palette_names(_png(3, full, width=600)) == VOC_CLASSES


def test_pngs_that_are_not_voc_palette_masks_bring_no_names():
    other = [(i, 255 - i, 7) for i in range(21)]
    assert voc_palette_names(_png(3, other)) is None  # a palette of other colours
    assert voc_palette_names(_png(3, VOC_PUBLISHED[:20])) is None  # VOC's first 20 colours only
    assert voc_palette_names(_png(2, VOC_PUBLISHED)) is None  # RGB, VOC's colours a suggested palette
    assert voc_palette_names(_png(0, None)) is None  # greyscale, no palette
    assert voc_palette_names(_png(3, VOC_PUBLISHED, data_first=True)) is None  # after the image data
    assert voc_palette_names(b"GIF89a" + _png(3, VOC_PUBLISHED)[6:]) is None


def test_a_cut_short_or_damaged_png_brings_no_names():
    png = _png(3, VOC_PUBLISHED)
    for cut in (8, 12, 20, 25, 33):  # inside the signature's end, IHDR's header, its data, after it
        assert voc_palette_names(png[:cut]) is None
    huge = struct.pack(">I", 0x80000000) + b"tEXt"  # a chunk whose length is over 2**31
    assert voc_palette_names(png[:33] + huge + png[33:]) is None


# --- --classes on every kind of target ----------------------------------------------------------


def _labels_by_folder(cache) -> dict[str, set[str]]:
    ds = CachedDataset(cache)
    out: dict[str, set[str]] = {}
    for i in range(len(ds)):
        out.setdefault(ds.source(i).split("/")[0], set()).add(ds.classes[int(ds.read_batch([i])[1][0])])
    return out


def test_classes_map_a_tree_of_numbered_folders_by_name(tmp_path):
    """Folders named 0, 1, 2 are names like any other (a folder tree is no YOLO numbering)."""
    from cachekit.tools.synthetic import make_synthetic_folder

    raw = make_synthetic_folder(tmp_path / "raw", 6, classes=3, size=(20, 24), seed=4)
    for i, folder in enumerate(sorted(p for p in raw.iterdir())):
        folder.rename(raw / str(i))
    names = tmp_path / "names.txt"
    names.write_text("2\n0\n1\n")
    quiet = {**QUIET, "pipeline": "classification-224", "size": 16}
    build(raw, tmp_path / "c", BuildConfig(classes=str(names), **quiet))
    assert CachedDataset(tmp_path / "c").classes == ["2", "0", "1"]
    assert _labels_by_folder(tmp_path / "c") == {"0": {"0"}, "1": {"1"}, "2": {"2"}}


def test_classes_that_miss_some_of_the_datas_are_named_five_at_most(tmp_path):
    from cachekit.tools.synthetic import make_synthetic_folder

    raw = make_synthetic_folder(tmp_path / "raw", 7, classes=7, size=(20, 24), seed=5)
    folders = sorted(p.name for p in raw.iterdir())
    names = tmp_path / "names.txt"
    names.write_text(folders[0] + "\n")
    shown = ", ".join(repr(f) for f in folders[1:6])
    with pytest.raises(UsageError, match=rf"does not name 6 class\(es\) the data has: {shown} \.\.\.$"):
        build(raw, tmp_path / "c", BuildConfig(classes=str(names), **QUIET))
    names.write_text(folders[0] + "\n" + folders[6] + "\n")
    with pytest.raises(UsageError, match=rf"does not name 5 class\(es\) the data has: {shown}$"):
        build(raw, tmp_path / "d", BuildConfig(classes=str(names), **QUIET))


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    from cachekit.tools.synthetic_objects import make_object_dataset

    return make_object_dataset(tmp_path_factory.mktemp("objects") / "raw", 6, size=(40, 60), classes=3)


def _boxes_by_source(cache) -> dict[str, list]:
    ds = CachedDataset(cache)
    out = {}
    for i in range(len(ds)):
        target = ds[i][1]
        rows = zip(target["classes"].tolist(), np.round(np.asarray(target["boxes"]), 3).tolist())
        out[ds.source(i)] = sorted((ds.classes[c], box) for c, box in rows)
    return out


def test_classes_reorder_yolo_boxes_named_by_a_data_yaml(objects, tmp_path):
    from cachekit.tools.synthetic_objects import object_classes

    want = list(reversed(object_classes(3)))
    names = tmp_path / "names.txt"
    names.write_text("\n".join(want) + "\n")
    build(objects, tmp_path / "plain", BuildConfig(annotations="yolo", **QUIET))
    build(objects, tmp_path / "c", BuildConfig(annotations="yolo", classes=str(names), **QUIET))
    assert CachedDataset(tmp_path / "c").classes == want
    plain = _boxes_by_source(tmp_path / "plain")
    assert sum(len(v) for v in plain.values()) > 6  # boxes of every class to map
    assert _boxes_by_source(tmp_path / "c") == plain


def test_classes_too_few_for_yolos_numbers_is_one_line(objects, tmp_path):
    import shutil

    raw = tmp_path / "raw"
    shutil.copytree(objects, raw)
    (raw / "data.yaml").unlink()  # classes are the numbers 0, 1, 2 the labels use
    names = tmp_path / "names.txt"
    names.write_text("a\nb\n")
    with pytest.raises(
        UsageError, match=rf"^--classes {names} names 2 classes; the yolo source uses class 2$"
    ):
        build(raw, tmp_path / "c", BuildConfig(annotations="yolo", classes=str(names), **QUIET))


def test_classes_reorder_a_python_datasets_labels_by_name(objects, tmp_path):
    from sourcekit import FileDataset

    files = [str(p) for p in sorted((objects / "images").glob("*.png"))[:4]]
    ds = FileDataset(files, ["x", "y"])  # sample i is class i % 2
    build(ds, tmp_path / "c", BuildConfig(classes=["z", "y", "x"], **QUIET))
    cached = CachedDataset(tmp_path / "c")
    assert cached.classes == ["z", "y", "x"]
    got = {int(cached.source(i)): cached.classes[cached[i][1]] for i in range(4)}
    assert got == {0: "x", 1: "y", 2: "x", 3: "y"}
