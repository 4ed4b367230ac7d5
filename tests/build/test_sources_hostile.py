"""Hostile sources: bad samples are skipped with their index and reason, bad files are one line or a
skip, a source that always raises stops in one line; nothing is written outside ``--out``."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from sourcekit import (
    BrokenAfter,
    ClassesPast,
    HugeView,
    LyingDataset,
    MixedDataset,
    add_member,
    make_objects,
    write_parquet,
    write_tars,
)

from cachekit import BuildConfig, BuildError, CachedDataset, UsageError, build
from cachekit.cli import main

QUIET = {"workers": 2, "progress": False, "order": "sorted", "pipeline": "none"}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_objects(tmp_path_factory.mktemp("objects") / "raw")


def _files(top: Path) -> set[str]:
    return {str(p.relative_to(top)) for p in top.rglob("*")}


def _skipped(out: Path) -> dict[str, str]:
    from cachekit import read_manifest

    return {s.path: s.reason for s in read_manifest(out).skipped}


def test_bad_samples_are_skipped_with_their_index_and_reason(objects, tmp_path):
    _, items = objects
    result = build(MixedDataset(Path(items[0].path).read_bytes()), tmp_path / "c", BuildConfig(**QUIET))
    reasons = {int(k): v for k, v in _skipped(tmp_path / "c").items()}
    assert result.manifest.num_samples == 2 and sorted(reasons) == [1, 2, 3, 4, 5, 6]
    assert "image file not an image" in reasons[1] and "dtype float32" in reasons[2]
    assert "not a finite number" in reasons[3] and "not an integer class" in reasons[4]
    assert "decod" in reasons[5] and "[N, 4]" in reasons[6]


def test_a_len_that_lies_is_one_line_and_samples_that_raise_are_skipped(objects, tmp_path):
    _, items = objects
    files = [it.path for it in items[:6]]
    with pytest.raises(UsageError, match=r"says 9 but dataset\[8\] raises IndexError"):
        build(LyingDataset(files, 9), tmp_path / "c", BuildConfig(**QUIET, shard_size=3))
    holes = LyingDataset(files + [files[0]], 7)
    holes.files[3] = str(tmp_path / "gone.jpg")  # a sample whose __getitem__ raises
    result = build(holes, tmp_path / "c", BuildConfig(**QUIET, shard_size=3))
    reasons = _skipped(tmp_path / "c")
    assert result.manifest.num_samples == 6 and list(reasons) == ["000000000003"]
    assert "FileNotFoundError" in reasons["000000000003"] and "__getitem__(3)" in reasons["000000000003"]


def test_a_source_that_raises_for_every_sample_stops_in_one_line(objects, tmp_path):
    _, items = objects
    with pytest.raises(BuildError, match="raised for each of the first 8 samples") as exc:
        build(
            BrokenAfter([it.path for it in items[:4]], 40),
            tmp_path / "c",
            BuildConfig(**QUIET, shard_size=10),
        )
    assert "\n" not in str(exc.value) and "the disk with sample" in str(exc.value)
    with pytest.raises(UsageError, match="first samples cannot be used"):
        build(BrokenAfter([], 10), tmp_path / "d", BuildConfig(**QUIET))


def test_a_class_past_the_named_classes_is_a_skip_not_a_cache_that_reads_refuse(objects, tmp_path):
    _, items = objects
    good = Path(items[0].path).read_bytes()
    result = build(ClassesPast(good), tmp_path / "c", BuildConfig(**QUIET))
    reasons = _skipped(tmp_path / "c")
    assert sorted(reasons) == ["000000000003", "000000000004"] and result.manifest.num_samples == 4
    assert "class 5 is past the 2 classes" in reasons["000000000003"]
    assert "not a class index" in reasons["000000000004"]
    ds = CachedDataset(tmp_path / "c")
    assert [int(ds[i][1]) for i in range(len(ds))] == [0, 1, 0, 1]  # every stored sample reads
    stream = ((good, {2: 7}.get(i, i % 2)) for i in range(4))  # the same for an iterable
    build(stream, tmp_path / "s", BuildConfig(**QUIET), classes=["a", "b"])
    assert "class 7 is past the 2 classes" in _skipped(tmp_path / "s")["000000000002"]


def test_a_generator_that_raises_among_its_first_samples_is_one_line(objects, tmp_path):
    _, items = objects
    good = Path(items[0].path).read_bytes()

    def breaking():
        yield good, 0
        raise ConnectionError("the server went away")

    with pytest.raises(UsageError, match=r"raised at sample 1 \(ConnectionError: the server went away\)"):
        build(breaking(), tmp_path / "c", BuildConfig(**QUIET), classes=["a"])


def test_a_dataset_that_cannot_be_pickled_is_one_line(objects, tmp_path):
    _, items = objects

    class Local:  # defined in a function: pickle cannot find it
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return Path(items[0].path).read_bytes(), 0

    with pytest.raises(UsageError, match="cannot be pickled.*module level"):
        build(Local(), tmp_path / "c", BuildConfig(**QUIET))
    unnamed = LyingDataset([items[0].path], 1)
    unnamed.classes = None
    with pytest.raises(UsageError, match="carry classes but nothing names them"):
        build(unnamed, tmp_path / "d", BuildConfig(**QUIET))


@pytest.mark.parametrize(
    "case, words",
    [
        ("no image column", "no rows a build can use"),
        ("not parquet", "not a readable Parquet file"),
        ("nothing there", "names no Parquet files"),
    ],
)
def test_parquet_that_cannot_be_read_is_one_line(objects, tmp_path, case, words):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "pq"
    folder.mkdir()
    if case == "no image column":
        pq.write_table(pa.table({"label": [1, 2]}), folder / "train-0.parquet")
    elif case == "not parquet":
        (folder / "train-0.parquet").write_bytes(b"PAR1 this is not parquet at all")
    res = CliRunner().invoke(main, ["build", str(folder / "train-*.parquet"), "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_truncated_parquet_file_is_left_out_and_the_others_built(objects, tmp_path):
    _, items = objects
    pattern = write_parquet(items, tmp_path / "pq", files=2)
    cut = tmp_path / "pq" / "train-00001.parquet"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    result = build(pattern, tmp_path / "c", BuildConfig(**QUIET), box_format="xywh")
    assert result.manifest.num_samples == len(items) // 2
    assert "not a readable Parquet file" in _skipped(tmp_path / "c")["train-00001.parquet"]


def test_a_hostile_tar_is_read_without_writing_or_following_anything(objects, tmp_path):
    _, items = objects
    write_tars(items, tmp_path / "tars", files=1)
    hostile = tmp_path / "tars" / "train-000000.tar"
    with tarfile.open(hostile, "a") as tar:
        add_member(tar, "../../escaped.png", Path(items[0].path).read_bytes())
        add_member(tar, "/etc/absolute.png", Path(items[0].path).read_bytes())
        add_member(tar, "link.png", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        add_member(tar, "hard.png", b"", type=tarfile.LNKTYPE, linkname="img_00000.png")
        add_member(tar, "zero.png", b"", type=tarfile.CHRTYPE, devmajor=1, devminor=5)
        add_member(tar, "fifo.png", b"", type=tarfile.FIFOTYPE)
        add_member(tar, "code.pickle", b"cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
        add_member(tar, "huge.json", b"{}" * (600 << 10))
    before = _files(tmp_path)
    result = build(str(hostile), tmp_path / "c", BuildConfig(**QUIET), box_format="xywh")
    assert result.manifest.num_samples == len(items)
    reasons = _skipped(tmp_path / "c")
    assert "outside the archive" in reasons["train-000000.tar/../../escaped.png"]
    assert "outside the archive" in reasons["train-000000.tar//etc/absolute.png"]
    assert (
        "a link" in reasons["train-000000.tar/link.png"] and "a link" in reasons["train-000000.tar/hard.png"]
    )
    assert "device" in reasons["train-000000.tar/zero.png"] and "FIFO" in reasons["train-000000.tar/fifo.png"]
    assert "over the" in reasons["train-000000.tar/huge.json"]
    assert {p for p in _files(tmp_path) - before if not p.startswith("c")} == set()  # nothing outside --out
    assert not os.path.exists("/tmp/pwned")


def test_a_tar_member_of_absurd_size_or_a_cut_tar_is_a_skip(objects, tmp_path):
    _, items = objects
    folder = tmp_path / "tars"
    write_tars(items, folder, files=2)
    with tarfile.open(folder / "train-000000.tar", "a") as tar:
        member = tarfile.TarInfo("giant.png")
        member.size = 1 << 40  # a header that claims a terabyte, with nothing behind it
        tar.fileobj.write(member.tobuf())
    second = folder / "train-000001.tar"
    second.write_bytes(second.read_bytes()[:700])  # cut inside its first member
    result = build(
        str(folder / "train-{000000..000001}.tar"), tmp_path / "c", BuildConfig(**QUIET), box_format="xywh"
    )
    reasons = _skipped(tmp_path / "c")
    assert result.manifest.num_samples >= 1
    assert any("giant.png" in p and "over the" in r for p, r in reasons.items()), reasons
    assert len(CachedDataset(tmp_path / "c")) == result.manifest.num_samples


def test_python_sources_refuse_folder_options_and_bad_keywords(objects, tmp_path):
    _, items = objects
    ds = LyingDataset([items[0].path], 1)
    with pytest.raises(UsageError, match="--masks name files beside a folder"):
        build(ds, tmp_path / "c", BuildConfig(**QUIET, masks=str(tmp_path)))
    with pytest.raises(UsageError, match="unknown options colour"):
        build(ds, tmp_path / "c", BuildConfig(**QUIET), colour="red")
    with pytest.raises(UsageError, match="box_format 'ltrb'"):
        build(ds, tmp_path / "c", BuildConfig(**QUIET), box_format="ltrb")
    with pytest.raises(UsageError, match="cannot build from a float"):
        build(3.5, tmp_path / "c", BuildConfig(**QUIET))


def test_a_stream_into_a_folder_of_other_files_is_refused_before_it_is_read(objects, tmp_path):
    _, items = objects
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    read = []

    def stream():
        for it in items:
            read.append(it)
            yield Path(it.path).read_bytes(), 0

    with pytest.raises(UsageError, match="is not empty.*--overwrite"):
        build(stream(), tmp_path / "c", BuildConfig(**QUIET), classes=["a"])
    assert len(read) <= 4 and _files(tmp_path / "c") == {"notes.txt"}  # only the first samples peeked


@pytest.mark.parametrize(
    "classes, words",
    [
        ("ab", "give a list of names"),  # not two classes 'a' and 'b'
        (["a", "b", "a"], "name 'a' twice"),
        ({0: "a", 5: "b"}, "the indices 0 to 1"),  # index 5 would silently become class 1
        ({"a": 0, "b": 0}, "the same index"),
    ],
)
def test_class_names_that_cannot_name_classes_are_one_line(objects, tmp_path, classes, words):
    _, items = objects
    with pytest.raises(UsageError, match=words):
        build(LyingDataset([items[0].path], 1), tmp_path / "c", BuildConfig(**QUIET), classes=classes)
    assert not (tmp_path / "c").exists()


def test_class_names_as_torchvision_s_class_to_idx_are_taken_in_index_order(objects, tmp_path):
    _, items = objects
    files = [it.path for it in items[:2]]
    result = build(LyingDataset(files, 2), tmp_path / "c", BuildConfig(**QUIET), classes={"b": 1, "a": 0})
    assert result.manifest.classes == ("a", "b")


_LAUGHS = (
    '<?xml version="1.0" encoding="{enc}"?>\n'
    '<!DOCTYPE annotation [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>\n'
    "<annotation><filename>&b;</filename><size><width>10</width><height>10</height></size></annotation>"
)


@pytest.mark.parametrize("enc", ["UTF-8", "UTF-16"])  # UTF-16 hides the declarations from a byte search
def test_voc_xml_declaring_entities_is_refused_in_any_encoding(enc):
    from cachekit.build.sources.voc import parse_voc

    with pytest.raises(ValueError, match="declares a DOCTYPE or ENTITY"):
        parse_voc(_LAUGHS.format(enc=enc).encode(enc.lower()), "Annotations/a.xml")
    plain = '<?xml version="1.0" encoding="UTF-16"?><annotation><filename>a.jpg</filename>'
    plain += "<size><width>10</width><height>8</height></size></annotation>"
    entry, _ = parse_voc(plain.encode("utf-16"), "Annotations/a.xml")  # an encoding alone is fine
    assert entry == {"file": "a.jpg", "size": [8, 10], "objects": []}


def test_a_tar_key_seen_twice_or_json_nested_past_the_stack_is_a_reported_skip(objects, tmp_path):
    _, items = objects
    write_tars(items, tmp_path / "tars", files=1)
    tar_path = tmp_path / "tars" / "train-000000.tar"
    first = Path(items[0].file).stem
    with tarfile.open(tar_path, "a") as tar:
        add_member(tar, f"{first}.png", Path(items[1].path).read_bytes())  # the key again, later
        add_member(tar, "deep.png", Path(items[2].path).read_bytes())
        add_member(tar, "deep.json", b"[" * 200_000)  # json.loads: RecursionError
    result = build(str(tar_path), tmp_path / "c", BuildConfig(**QUIET), box_format="xywh")
    reasons = _skipped(tmp_path / "c")
    assert result.manifest.num_samples == len(items)
    assert "a second image for the key" in reasons[f"train-000000.tar/{first}.png"]
    assert "its .json is not JSON" in reasons["train-000000.tar/deep.png"]


def test_hugging_face_metadata_nested_past_the_stack_names_no_classes():
    from cachekit.build.sources.parquet import hf_class_names

    assert hf_class_names({b"huggingface": b"[" * 200_000}, "label") is None


def test_an_array_too_large_for_any_sample_is_a_skip_before_it_is_copied(objects, tmp_path):
    _, items = objects
    result = build(HugeView(Path(items[0].path).read_bytes()), tmp_path / "c", BuildConfig(**QUIET))
    assert result.manifest.num_samples == 2
    assert "bytes of RGB a sample may have" in _skipped(tmp_path / "c")["000000000001"]


def test_a_tar_cls_that_is_not_an_ascii_integer_is_a_skip(objects, tmp_path):
    _, items = objects
    write_tars(items, tmp_path / "tars", files=1)
    tar_path = tmp_path / "tars" / "train-000000.tar"
    with tarfile.open(tar_path, "a") as tar:
        for key, cls in (("sup", "²".encode()), ("long", b"1" * 5000), ("ok", b"2")):
            add_member(tar, f"{key}.png", Path(items[0].path).read_bytes())
            add_member(tar, f"{key}.cls", cls)  # isdigit() is true of "²"; int() refuses 5000 digits
    result = build(str(tar_path), tmp_path / "c", BuildConfig(**QUIET), box_format="xywh")
    reasons = _skipped(tmp_path / "c")
    assert result.manifest.num_samples == len(items), reasons
    for key in ("sup", "long"):
        assert "is not an integer class" in reasons[f"train-000000.tar/{key}.png"]


def test_source_options_that_would_be_misread_are_one_line(objects, tmp_path):
    _, items = objects
    ds = LyingDataset([items[0].path, items[1].path], 2)
    with pytest.raises(UsageError, match="normalized='no': give True or False"):  # bool("no") is True
        build(ds, tmp_path / "c", BuildConfig(**QUIET), box_format="xyxy", normalized="no")
    with pytest.raises(UsageError, match="strings or integers"):  # str(object()) differs each run
        build(ds, tmp_path / "c", BuildConfig(**QUIET), source_id=[object(), object()])
    import numpy as np

    assert (
        build(ds, tmp_path / "c", BuildConfig(**QUIET), source_id=[np.int64(4), "b"]).manifest.num_samples
        == 2
    )


def test_a_text_column_the_parquet_files_lack_is_one_line_not_a_cache_without_captions(objects, tmp_path):
    _, items = objects
    pattern = write_parquet(items, tmp_path / "pq")
    with pytest.raises(UsageError, match="no column 'captions'"):
        build(pattern, tmp_path / "c", BuildConfig(**QUIET), box_format="xywh", text_column="captions")
    result = build(pattern, tmp_path / "c", BuildConfig(**QUIET), box_format="xywh", text_column="caption")
    assert "text" in result.manifest.sample.fields


def test_a_names_file_names_the_numbered_classes_of_tars(objects, tmp_path):
    """Tars without class names number their classes; --classes names them in that order (as for a
    YOLO folder without data.yaml), and one name short is one line."""
    _, items = objects
    pattern = write_tars(items, tmp_path / "tars")
    (tmp_path / "names.txt").write_text("circle\nsquare\ntriangle\n")
    config = BuildConfig(**QUIET, classes=str(tmp_path / "names.txt"))
    result = build(pattern, tmp_path / "c", config, box_format="xywh")
    assert result.manifest.classes == ("circle", "square", "triangle")
    (tmp_path / "short.txt").write_text("circle\nsquare\n")
    with pytest.raises(UsageError, match="names 2 classes; the webdataset source uses class 2"):
        build(
            pattern,
            tmp_path / "d",
            BuildConfig(**QUIET, classes=str(tmp_path / "short.txt")),
            box_format="xywh",
        )
