"""Sources that cannot change a cache's data in silence: a resumed iterable that yields other samples,
fields that appear after the first samples, damaged tar headers, Parquet columns that are not there,
class names and crowd flags that a source states."""

from __future__ import annotations

import cv2
import pytest
from sourcekit import breaking, make_objects, object_stream

from cachekit import BuildConfig, CachedDataset, UsageError, build, read_manifest
from cachekit.tools.synthetic_objects import object_classes

QUIET = {"workers": 2, "progress": False, "order": "sorted", "shard_size": 3}


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_objects(tmp_path_factory.mktemp("objects") / "raw")


def _stream_build(samples, out, config=BuildConfig(**QUIET)):
    return build(samples, out, config, box_format="xywh", classes=object_classes(3), source_id="s")


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "manifest.json"}


def test_a_resumed_iterable_that_yields_another_order_is_refused(objects, tmp_path):
    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        _stream_build(breaking(object_stream(items), 7), tmp_path / "c")
    shuffled = list(object_stream(items))
    shuffled = shuffled[1:] + shuffled[:1]  # another order: every finished shard holds other samples
    with pytest.raises(UsageError, match="other samples than the build it resumes.*repeat its order"):
        _stream_build(iter(shuffled), tmp_path / "c")
    assert not (tmp_path / "c" / "manifest.json").exists()
    again = _stream_build(object_stream(items), tmp_path / "c")  # the same order: resumed, clean bytes
    assert again.status == "resumed" and (again.reused_shards, again.built_shards) == (2, 1)
    _stream_build(object_stream(items), tmp_path / "clean")
    assert _files(tmp_path / "c") == _files(tmp_path / "clean")


def test_a_resumed_iterable_whose_finished_shard_changed_is_refused_and_overwrite_rebuilds_it(
    objects, tmp_path
):
    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        _stream_build(breaking(object_stream(items), 7), tmp_path / "c")
    changed = list(object_stream(items))
    changed[4] = {**changed[4], "text": "another caption"}  # one sample of the second finished shard
    with pytest.raises(UsageError, match=r"samples 3 to 5\).*rebuild with --overwrite"):
        _stream_build(iter(changed), tmp_path / "c")
    redone = _stream_build(iter(changed), tmp_path / "c", BuildConfig(**QUIET, overwrite=True))
    assert redone.manifest.num_samples == len(items)
    assert CachedDataset(tmp_path / "c")[4][1]["text"] == "another caption"
    assert CachedDataset(tmp_path / "c")[3][1]["text"] == items[3].text
    assert read_manifest(tmp_path / "c").source["layout"] == "stream"


class BoxesLate:
    """Eight samples: a bare class each, but sample 6 (past the first samples read at discovery) has boxes."""

    classes = ["a", "b"]

    def __init__(self, good: bytes, late: int = 6) -> None:
        self.good, self.late = good, late

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == self.late:
            return self.good, {"label": 1, "boxes": [[1.0, 2.0, 9.0, 12.0]], "classes": [1]}
        return self.good, i % 2


def test_a_field_first_seen_after_the_probe_is_a_listed_skip_never_dropped_in_silence(objects, tmp_path):
    _, items = objects
    good = open(items[0].path, "rb").read()
    result = build(BoxesLate(good), tmp_path / "c", BuildConfig(**QUIET))
    assert result.manifest.num_samples == 7
    assert [s.path for s in result.manifest.skipped] == ["000000000006"]
    assert "boxes" in result.manifest.skipped[0].reason and "fields=" in result.manifest.skipped[0].reason
    assert "boxes" not in result.manifest.sample.fields


def test_fields_are_the_union_of_the_first_samples_or_declared(objects, tmp_path):
    _, items = objects
    good = open(items[0].path, "rb").read()
    probed = build(BoxesLate(good, late=2), tmp_path / "p", BuildConfig(**QUIET))  # sample 2 of the probe
    assert "boxes" in probed.manifest.sample.fields and not probed.manifest.skipped
    ds = CachedDataset(tmp_path / "p")
    assert len(ds[2][1]["boxes"]) == 1 and ds[2][1]["classes"].tolist() == [1]
    assert len(ds[0][1]["boxes"]) == 0  # a sample without boxes: none, kept
    declared = build(BoxesLate(good), tmp_path / "d", BuildConfig(**QUIET), fields=["boxes"])
    assert declared.manifest.num_samples == 8 and not declared.manifest.skipped
    ds = CachedDataset(tmp_path / "d")
    assert ds[6][1]["classes"].tolist() == [1] and len(ds[6][1]["boxes"]) == 1 and len(ds[5][1]["boxes"]) == 0
    streamed = build(iter([BoxesLate(good)[i] for i in range(8)]), tmp_path / "s", BuildConfig(**QUIET),
                     classes=["a", "b"], fields=("boxes",))  # fmt: skip
    assert streamed.manifest.num_samples == 8 and "boxes" in streamed.manifest.sample.fields
    with pytest.raises(UsageError, match="fields=.*one of label, boxes"):
        build(BoxesLate(good), tmp_path / "x", BuildConfig(**QUIET), fields=["bbox"])


def _parquet(path, rows, names=None, row_group=7):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    if names is not None:
        features = {"label": {"names": names, "_type": "ClassLabel"}}
        table = table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path, row_group_size=row_group)
    return str(path)


def _cli(*args: str, switch: float | None = None):
    """``cachekit`` in a process of its own; ``switch``: seconds its main thread keeps the GIL (a
    thread of a library waiting for it at the end waits longer)."""
    import subprocess
    import sys

    code = "import sys\nfrom cachekit.cli import main\nsys.argv[0] = 'cachekit'\nmain()"
    if switch is not None:
        code = f"import sys\nsys.setswitchinterval({switch})\n{code}"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


@pytest.mark.parametrize("option", ["--label-column", "--boxes-column", "--text-column"])
def test_a_parquet_column_named_that_the_files_lack_is_one_line(objects, tmp_path, option):
    _, items = objects
    good = open(items[0].path, "rb").read()
    pattern = _parquet(tmp_path / "a.parquet", [{"image": {"bytes": good}, "label": 0}] * 3, ["x"])
    res = _cli("build", pattern, "--out", str(tmp_path / "c"), option, "cls", "--quiet")
    assert res.returncode == 2 and "no column 'cls'" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    key = option[2:].replace("-", "_")  # --label-column: label_column=
    with pytest.raises(UsageError, match="no column 'cls'"):
        build(pattern, tmp_path / "d", BuildConfig(**QUIET), **{key: "cls"})
    default = build(pattern, tmp_path / "e", BuildConfig(**QUIET))  # under its default name: optional
    assert default.manifest.num_samples == 3


def test_a_refused_parquet_build_exits_2_every_time_never_aborts(objects, tmp_path):
    _, items = objects
    good = open(items[0].path, "rb").read()
    rows = [{"image": {"bytes": good}, "label": i % 6} for i in range(400)]
    for k in range(4):  # many row groups read at discovery; class 5 is past the files' two names
        _parquet(tmp_path / f"p-{k}.parquet", rows, ["a", "b"])
    codes = []
    for k in range(10):
        res = _cli(
            "build", str(tmp_path / "p-*.parquet"), "--out", str(tmp_path / f"c{k}"), "--quiet", switch=30
        )
        codes.append(res.returncode)
        assert "class 5 is past the 2 class names" in res.stderr and "terminate" not in res.stderr
    assert codes == [2] * 10


class ClassLabel:
    def __init__(self, names):
        self.names = names


class Sequence:
    def __init__(self, feature):
        self.feature = feature


class HFLike:
    """A ``datasets.Dataset`` by duck typing: dict rows, ``features`` with ClassLabel names (not sorted)."""

    def __init__(self, good: bytes, features: dict, boxes: bool = False) -> None:
        self.good, self.features, self.boxes = good, features, boxes

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        if self.boxes:
            return {"image": self.good, "boxes": [[1.0, 1.0, 8.0, 9.0]], "classes": [i % 3]}
        return {"image": self.good, "label": i % 3}


def test_a_datasets_dataset_keeps_its_class_label_names_in_index_order(objects, tmp_path):
    _, items = objects
    good = open(items[0].path, "rb").read()
    names = ["zebra", "apple", "mango"]
    result = build(
        HFLike(good, {"image": object(), "label": ClassLabel(names)}), tmp_path / "c", BuildConfig(**QUIET)
    )
    assert result.manifest.classes == tuple(names)
    ds = CachedDataset(tmp_path / "c")
    assert [ds.classes[ds[i][1]] for i in range(4)] == ["zebra", "apple", "mango", "zebra"]
    objects_ = {"objects": Sequence({"bbox": Sequence(object()), "category": ClassLabel(names)})}
    boxed = build(HFLike(good, objects_, boxes=True), tmp_path / "b", BuildConfig(**QUIET))
    assert boxed.manifest.classes == tuple(names)


def test_parquet_objects_keep_iscrowd_and_class_label_names_keep_their_index_order(objects, tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, items = objects
    good = open(items[0].path, "rb").read()
    rows = [{"image": {"bytes": good}, "objects": {"bbox": [[1, 1, 5, 5], [2, 2, 8, 8]], "category": [0, 1],
                                                    "iscrowd": [1, 0]}}] * 2  # fmt: skip
    names = ["zebra", "apple"]  # not in sorted order
    features = {
        "objects": {"feature": {"category": {"names": names, "_type": "ClassLabel"}}, "_type": "Sequence"}
    }
    table = pa.Table.from_pylist(rows).replace_schema_metadata(
        {b"huggingface": json.dumps({"info": {"features": features}})}
    )
    pq.write_table(table, tmp_path / "a.parquet")
    result = build(str(tmp_path / "a.parquet"), tmp_path / "c", BuildConfig(**QUIET), box_format="xywh")
    assert result.manifest.classes == ("zebra", "apple")
    target = CachedDataset(tmp_path / "c")[1][1]
    assert target["iscrowd"].tolist() == [1, 0] and target["classes"].tolist() == [0, 1]


def test_voc_names_take_voc_s_own_order_and_yolo_names_by_id(objects, tmp_path):
    from cachekit.build.sources.voc import VOC_CLASSES

    _, items = objects
    raw = tmp_path / "voc"
    (raw / "Annotations").mkdir(parents=True)
    (raw / "JPEGImages").mkdir()
    (raw / "JPEGImages" / "a.png").write_bytes(open(items[0].path, "rb").read())
    h, w = cv2.imread(items[0].path).shape[:2]
    boxes = "".join(
        f"<object><name>{n}</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object>"
        for n in ("person", "aeroplane")
    )
    (raw / "Annotations" / "a.xml").write_text(
        f"<annotation><filename>a.png</filename><size><width>{w}</width><height>{h}</height></size>{boxes}"
        "</annotation>"
    )
    result = build(raw, tmp_path / "c", BuildConfig(**QUIET, annotations="voc"))
    assert result.manifest.classes == VOC_CLASSES and VOC_CLASSES[:2] == ("aeroplane", "bicycle")
    assert CachedDataset(tmp_path / "c")[0][1]["classes"].tolist() == [14, 0]  # person, aeroplane
    yolo = tmp_path / "yolo"
    (yolo / "images").mkdir(parents=True)
    (yolo / "labels").mkdir()
    (yolo / "images" / "a.png").write_bytes(open(items[0].path, "rb").read())
    (yolo / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n")
    (yolo / "data.yaml").write_text("names:\n  1: bee\n  0: ant\n")  # by id, not in file order
    result = build(yolo, tmp_path / "y", BuildConfig(**QUIET, annotations="yolo"))
    assert result.manifest.classes == ("ant", "bee")


class Crowd2:
    classes = ["a"]

    def __init__(self, good: bytes) -> None:
        self.good = good

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int):
        return self.good, {"boxes": [[1.0, 1.0, 8.0, 9.0]], "classes": [0], "iscrowd": [2 if i == 1 else 0]}


def test_a_sample_s_iscrowd_2_is_skipped_at_build_with_its_reason(objects, tmp_path):
    _, items = objects
    result = build(Crowd2(open(items[0].path, "rb").read()), tmp_path / "c", BuildConfig(**QUIET))
    assert result.manifest.num_samples == 2
    assert [(s.path, "iscrowd" in s.reason) for s in result.manifest.skipped] == [("000000000001", True)]


def test_classes_are_a_names_file_or_a_list_in_build_config_and_in_build(objects, tmp_path):
    from sourcekit import FileDataset

    _, items = objects
    files = [it.path for it in items[:4]]
    names_file = tmp_path / "names.txt"
    names_file.write_text("dog\ncat\n")
    ds = FileDataset(files, ["x", "y"])  # classes i % 2
    by_file = build(ds, tmp_path / "f", BuildConfig(**QUIET), classes=str(names_file))
    by_list = build(ds, tmp_path / "l", BuildConfig(**QUIET), classes=["dog", "cat"])
    assert by_file.manifest.classes == by_list.manifest.classes == ("dog", "cat")
    assert [CachedDataset(tmp_path / "f")[i][1] for i in range(4)] == [0, 1, 0, 1]
    # BuildConfig's classes: the class order, from a file or a list alike
    order_file = tmp_path / "order.txt"
    order_file.write_text("y\nx\n")
    by_file = build(ds, tmp_path / "cf", BuildConfig(**QUIET, classes=str(order_file)))
    by_list = build(ds, tmp_path / "cl", BuildConfig(**QUIET, classes=["y", "x"]))
    assert by_file.manifest.classes == by_list.manifest.classes == ("y", "x")
    assert [CachedDataset(tmp_path / "cl")[i][1] for i in range(4)] == [1, 0, 1, 0]
    with pytest.raises(UsageError, match="names 'y' twice"):
        build(ds, tmp_path / "bad", BuildConfig(**QUIET, classes=["y", "y", "x"]))


def _tar_of(path, items, keys: int = 5, pax: dict | None = None):
    """``keys`` samples ``k<i>.png`` + ``k<i>.cls``; ``pax``: PAX records of k1.cls's header."""
    import io
    import tarfile

    good = open(items[0].path, "rb").read()
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(keys):
            for name, data in ((f"k{i}.png", good), (f"k{i}.cls", str(i % 2).encode())):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                if pax and name == "k1.cls":
                    member.pax_headers = dict(pax)
                tar.addfile(member, io.BytesIO(data))
    return path


def _set_size(path, name: str, size: int) -> None:
    """Write ``size`` into member ``name``'s header and fix its checksum, as a damaged writer would."""
    import tarfile

    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tar:
        offset = tar.getmember(name).offset
    header = data[offset : offset + 512]
    header[124:136] = b"%011o\0" % size
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    data[offset : offset + 512] = header
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["one block more", "past the end", "pax 10**15"])
def test_a_damaged_tar_header_ends_the_walk_there_and_is_listed(objects, tmp_path, how):
    """A size one block too long leads to a block that is no header; one of 10**9 or a PAX size of
    10**15 claims all that follows: the walk ends there, listed; k1 is left out, nothing after it is
    read as a member (it may lie inside a member's bytes), k0 is built."""
    import tarfile

    _, items = objects
    path = tmp_path / "t.tar"
    if how == "pax 10**15":
        _tar_of(path, items, pax={"size": str(10**15)})
    else:
        _tar_of(path, items)
        size = len(open(items[0].path, "rb").read())
        _set_size(path, "k1.png", -(-size // 512) * 512 + 1 if how == "one block more" else 10**9)
    with tarfile.open(path) as tar:
        k1 = [tar.next() for _ in range(3)][2]  # k0.png, k0.cls, k1.png
    result = build(str(path), tmp_path / "c", BuildConfig(**QUIET), classes=["a", "b"])
    reasons = {s.path: s.reason for s in result.manifest.skipped}
    if how == "one block more":  # the next header would be k1.cls's data block
        at = k1.offset_data + -(-k1.size // 512) * 512
        assert reasons.pop("t.tar").startswith(f"a damaged header at byte {at} (bad checksum): the ")
        assert reasons == {
            "t.tar/k1": f"its members may go on past the damaged header at byte {at}, left out"
        }
    else:
        name, why = ("k1.png", "runs past") if how == "past the end" else ("k1.cls", f"{10**15} bytes, over")
        assert reasons.pop("t.tar").startswith(f"'{name}', whose header at byte ")
        assert reasons.pop(f"t.tar/{name}").startswith(why) and reasons == {}
    assert result.manifest.num_samples == 1
    assert CachedDataset(tmp_path / "c").source(0) == "t.tar/k0.png"


def test_max_samples_stops_an_endless_iterable_and_a_long_one_without_it_warns_once(
    objects, tmp_path, monkeypatch
):
    import itertools
    import warnings

    from cachekit.build.sources import iterable as itersource

    _, items = objects
    endless = itertools.cycle(list(object_stream(items)))
    result = build(endless, tmp_path / "c", BuildConfig(**QUIET), box_format="xywh", classes=object_classes(3),
                   max_samples=5)  # fmt: skip
    assert result.manifest.num_samples == 5
    monkeypatch.setattr(itersource, "LARGE_STREAM", 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _stream_build(object_stream(items), tmp_path / "w")
    said = [str(w.message) for w in caught if "max_samples=" in str(w.message)]
    assert len(said) == 1 and "has yielded 4 samples" in said[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(object_stream(items), tmp_path / "m", BuildConfig(**QUIET), box_format="xywh",
              classes=object_classes(3), max_samples=6)  # fmt: skip
    assert not [w for w in caught if "max_samples=" in str(w.message)]
    with pytest.raises(UsageError, match="max_samples=0"):
        build(
            object_stream(items),
            tmp_path / "z",
            BuildConfig(**QUIET),
            classes=object_classes(3),
            max_samples=0,
        )


def test_max_samples_takes_the_first_rows_of_parquet_and_tars_and_is_refused_for_a_folder(objects, tmp_path):
    from sourcekit import write_parquet, write_tars

    root, items = objects
    pattern = write_parquet(items, tmp_path / "pq")  # 2 files of 4 rows
    res = _cli("build", pattern, "--out", str(tmp_path / "p"), "--max-samples", "5", "--box-format", "xywh",
               "--quiet", "--workers", "1")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert read_manifest(tmp_path / "p").num_samples == 5
    tars = write_tars(items, tmp_path / "tars")
    result = build(tars, tmp_path / "t", BuildConfig(**QUIET), box_format="xywh", classes=object_classes(3),
                   max_samples=3)  # fmt: skip
    assert result.manifest.num_samples == 3
    assert CachedDataset(tmp_path / "t")[2][1]["text"] == items[2].text  # the first three, in order
    with pytest.raises(UsageError, match="--max-samples takes the first samples"):
        build(root, tmp_path / "f", BuildConfig(**QUIET), max_samples=3)


def test_the_class_order_maps_a_dataset_s_box_classes_and_labels_as_they_are_read(objects, tmp_path):
    _, items = objects
    good = open(items[0].path, "rb").read()
    rows = [(good, {"boxes": [[1.0, 1.0, 8.0, 9.0], [2.0, 2.0, 6.0, 7.0]], "classes": [0, 1], "labels": [1]})]
    result = build(
        iter(rows * 3), tmp_path / "c", BuildConfig(**QUIET, classes=["b", "z", "a"]), classes=["a", "b"]
    )
    assert result.manifest.classes == ("b", "z", "a")
    target = CachedDataset(tmp_path / "c")[0][1]
    names = [result.manifest.classes[c] for c in target["classes"].tolist()]
    assert names == ["a", "b"] and [result.manifest.classes[c] for c in target["labels"].tolist()] == ["b"]


def test_a_finished_shard_recorded_again_keeps_the_digest_of_its_samples(objects, tmp_path):
    from cachekit.build.resume import read_partial, write_sidecar
    from cachekit.build.shardjob import ShardResult
    from cachekit.store.location import open_location

    _, items = objects
    with pytest.raises(UsageError, match="raised at sample 7"):
        _stream_build(breaking(object_stream(items), 7), tmp_path / "c")
    out = open_location(tmp_path / "c", {})
    found = read_partial(out)
    assert len(found.samples) == 2 and set(found.samples) == set(found.finished)
    for k, (info, skipped) in enumerate(found.finished.values()):
        write_sidecar(out, ShardResult(k, info, skipped))  # as the build that plans the whole stream does
    assert read_partial(out).samples == found.samples


def test_a_finished_stream_cache_run_again_with_other_samples_is_refused_not_up_to_date(objects, tmp_path):
    _, items = objects
    first = _stream_build(object_stream(items), tmp_path / "c")
    assert first.status == "built" and len(first.manifest.source["samples"]) == len(first.manifest.shards)
    assert _stream_build(object_stream(items), tmp_path / "c").status == "up to date"
    changed = list(object_stream(items))
    changed[0] = {**changed[0], "text": "another caption"}
    with pytest.raises(UsageError, match=r"other samples than the build it resumes.*\(samples 0 to 2\)"):
        _stream_build(iter(changed), tmp_path / "c")
    assert CachedDataset(tmp_path / "c")[0][1]["text"] == items[0].text


def test_max_samples_of_a_dataset_takes_its_first_indices_and_their_ids(objects, tmp_path):
    from sourcekit import FileDataset

    _, items = objects
    ds = FileDataset([it.path for it in items], ["x", "y"])
    ids = [f"id{i}" for i in range(len(items))]
    result = build(ds, tmp_path / "c", BuildConfig(**QUIET), source_id=ids, max_samples=3)
    assert result.manifest.num_samples == 3
    assert [CachedDataset(tmp_path / "c")[i][1] for i in range(3)] == [0, 1, 0]
