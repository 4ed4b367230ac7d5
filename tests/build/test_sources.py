"""Every kind of source (Python datasets of each image type, a generator, Parquet, WebDataset tars,
Pascal VOC) stores what a folder of the same images stores: pixels, boxes, masks, captions, for each
shard format; their options, updates and the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from sourcekit import (
    IMAGE_KINDS,
    FileDataset,
    ObjectDataset,
    TorchvisionDetection,
    make_objects,
    object_stream,
    write_parquet,
    write_tars,
    write_voc,
)

from cachekit import BuildConfig, CachedDataset, build, read_manifest
from cachekit.cli import main
from cachekit.tools.synthetic_objects import object_classes
from cachekit.tools.verify import verify

QUIET = {"workers": 2, "progress": False, "order": "sorted", "shard_size": 3}
RECIPE = {"pipeline": "letterbox-640", "size": 64}
#: (shard format, how samples are stored)
FORMATS = [("pt", "pixels"), ("hdf5", "pixels"), ("zarr", "png")]
#: Each kind of source, and what its samples carry besides boxes.
KINDS = {**{f"dataset-{k}": ("mask", "text") for k in IMAGE_KINDS}, "generator": ("mask", "text"),
         "parquet": ("text",), "tar": ("text",), "voc": ()}  # fmt: skip


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_objects(tmp_path_factory.mktemp("objects") / "raw")


@pytest.fixture(scope="module")
def references(objects, tmp_path_factory):
    """The folder build of the same images (COCO boxes, masks), per format, made once."""
    root, _ = objects
    made = {}

    def reference(fmt: str, store: str):
        if (fmt, store) not in made:
            out = tmp_path_factory.mktemp("reference") / f"{fmt}-{store}"
            config = BuildConfig(
                annotations=str(root / "coco.json"), masks=str(root / "masks"), format=fmt, store=store,
                **RECIPE, **QUIET,
            )  # fmt: skip
            build(root, out, config)
            made[fmt, store] = out
        return made[fmt, store]

    return reference


def _build(kind: str, objects, tmp_path, config: BuildConfig):
    root, items = objects
    out = tmp_path / "cache"
    names = object_classes(3)
    if kind.startswith("dataset-"):
        return build(ObjectDataset(items, kind.split("-", 1)[1]), out, config, box_format="xywh")
    if kind == "generator":
        return build(object_stream(items), out, config, box_format="xywh", classes=names)
    if kind == "parquet":
        pattern = write_parquet(items, tmp_path / "parquet")
        return build(pattern, out, config, box_format="xywh", text_column="caption")
    if kind == "tar":
        return build(write_tars(items, tmp_path / "tars"), out, config, box_format="xywh", classes=names)
    config = BuildConfig(**{**config.__dict__, "annotations": "voc"})
    return build(write_voc(items, tmp_path / "voc"), out, config)


def _names(ds, t) -> list[str]:
    return [ds.classes[c] for c in t["classes"].tolist()]


@pytest.mark.parametrize("fmt, store", FORMATS, ids=[f"{f}-{s}" for f, s in FORMATS])
@pytest.mark.parametrize("kind", list(KINDS))
def test_every_source_stores_what_a_folder_of_the_same_images_stores(
    objects, references, tmp_path, kind, fmt, store
):
    _, items = objects
    result = _build(kind, objects, tmp_path, BuildConfig(format=fmt, store=store, **RECIPE, **QUIET))
    assert result.manifest.num_samples == len(items) and not result.manifest.skipped
    reference, built = CachedDataset(references(fmt, store)), CachedDataset(tmp_path / "cache")
    assert len(built) == len(reference)
    boxes = 0
    for i in range(len(items)):
        (a, ta), (b, tb) = reference[i], built[i]
        assert np.array_equal(a.numpy(), b.numpy()), i  # the same pixels, byte for byte
        np.testing.assert_allclose(ta["boxes"].numpy(), tb["boxes"].numpy(), atol=1e-4)
        assert _names(reference, ta) == _names(built, tb)
        boxes += len(tb["boxes"])
        if "mask" in KINDS[kind]:
            assert np.array_equal(ta["mask"].numpy(), tb["mask"].numpy())
        if "text" in KINDS[kind]:
            assert tb["text"] == items[i].text
    assert boxes > len(items)  # the boxes were there to compare
    assert verify(tmp_path / "cache").ok


def test_torchvision_detection_targets_name_box_classes_labels_and_carry_their_format(
    objects, references, tmp_path
):
    _, items = objects
    build(TorchvisionDetection(items), tmp_path / "c", BuildConfig(**RECIPE, **QUIET))  # box_format left xyxy
    reference, built = CachedDataset(references("pt", "pixels")), CachedDataset(tmp_path / "c")
    assert "labels" not in built.manifest.sample.fields
    for i in range(len(items)):
        np.testing.assert_allclose(reference[i][1]["boxes"].numpy(), built[i][1]["boxes"].numpy(), atol=1e-4)
        assert _names(reference, reference[i][1]) == _names(built, built[i][1])


def test_voc_difficult_objects_are_kept_as_crowds(objects, tmp_path):
    _, items = objects
    build(
        write_voc(items, tmp_path / "voc", difficult=1),
        tmp_path / "c",
        BuildConfig(annotations="voc", **QUIET),
    )
    ds = CachedDataset(tmp_path / "c")
    flags = np.concatenate([ds[i][1]["iscrowd"].numpy() for i in range(len(ds))])
    assert len(flags) > 0 and (flags == 1).all()


def test_a_classification_dataset_takes_its_classes_and_builds_in_parallel_by_index(objects, tmp_path):
    _, items = objects
    ds = FileDataset([it.path for it in items], ["cat", "dog"])
    result = build(ds, tmp_path / "c", BuildConfig(**RECIPE, workers=2, progress=False, shard_size=2))
    m = result.manifest
    assert m.classes == ("cat", "dog") and m.order["kind"] == "shuffled" and len(m.shards) == 4
    cache = CachedDataset(tmp_path / "c")
    assert sorted(int(cache.source(i)) % 2 == cache[i][1] for i in range(len(cache))) == [True] * len(items)
    assert (
        build(ds, tmp_path / "c", BuildConfig(**RECIPE, workers=2, progress=False, shard_size=2)).status
        == "up to date"
    )


def test_source_ids_per_sample_rebuild_only_the_shards_that_changed(objects, tmp_path):
    _, items = objects
    files = [it.path for it in items]
    config = BuildConfig(**RECIPE, workers=1, progress=False, shard_size=2, order="sorted")
    ids = [f"v1-{i}" for i in range(len(files))]
    build(FileDataset(files, ["a", "b"]), tmp_path / "c", config, source_id=ids)
    ids[5] = "v2-5"
    again = build(FileDataset(files, ["a", "b"]), tmp_path / "c", BuildConfig(**{**config.__dict__, "update": True}),
                  source_id=ids)  # fmt: skip
    assert again.status == "updated" and again.built_shards == 1 and again.reused_shards == 3


def test_options_that_shape_a_dataset_s_targets_are_in_its_shards_names(objects, tmp_path):
    from cachekit import UsageError

    _, items = objects
    config = BuildConfig(**RECIPE, **QUIET)
    build(ObjectDataset(items), tmp_path / "c", config, box_format="xywh")
    with pytest.raises(UsageError, match="changed since"):  # the same boxes read another way
        build(ObjectDataset(items), tmp_path / "c", config, box_format="xyxy")
    pattern = write_parquet(items, tmp_path / "pq")
    build(pattern, tmp_path / "p", config, box_format="xywh")
    with pytest.raises(UsageError, match="no column 'img'"):
        build(pattern, tmp_path / "p", config, box_format="xywh", image_column="img")


def test_a_generator_resumes_by_position_reading_only_what_is_not_built(objects, tmp_path):
    _, items = objects
    seen = []

    def stream():
        for sample in object_stream(items):
            seen.append(1)
            yield sample

    config = BuildConfig(**QUIET)
    first = build(stream(), tmp_path / "c", config, box_format="xywh", classes=object_classes(3))
    assert first.status == "built" and first.built_shards == 3 and len(seen) == len(items)
    again = build(stream(), tmp_path / "c", config, box_format="xywh", classes=object_classes(3))
    assert again.status == "up to date" and len(seen) == 2 * len(items)
    assert read_manifest(tmp_path / "c").source["layout"] == "stream"


def test_a_stream_that_breaks_resumes_by_position_to_the_clean_bytes(objects, tmp_path):
    from cachekit import UsageError

    _, items = objects
    names = object_classes(3)

    def breaking(at: int):
        for k, sample in enumerate(object_stream(items)):
            if k == at:
                raise ConnectionError("the stream's server went away")
            yield sample

    config = BuildConfig(**QUIET)
    with pytest.raises(UsageError, match="raised at sample 7 .*ConnectionError"):
        build(breaking(7), tmp_path / "c", config, box_format="xywh", classes=names, source_id="s")
    again = build(
        object_stream(items), tmp_path / "c", config, box_format="xywh", classes=names, source_id="s"
    )
    assert again.status == "resumed" and (again.reused_shards, again.built_shards) == (2, 1)
    build(object_stream(items), tmp_path / "clean", config, box_format="xywh", classes=names, source_id="s")
    files = {p.name: p.read_bytes() for p in (tmp_path / "clean").iterdir() if p.name != "manifest.json"}
    assert {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir() if p.name != "manifest.json"} == files
    assert read_manifest(tmp_path / "c").to_json() | {"created": ""} == read_manifest(
        tmp_path / "clean"
    ).to_json() | {"created": ""}


def test_cli_builds_parquet_and_tars_with_their_column_options(objects, tmp_path):
    _, items = objects
    pattern = write_parquet(items, tmp_path / "pq")
    run = CliRunner().invoke
    res = run(main, ["build", pattern, "--out", str(tmp_path / "p"), "--box-format", "xywh", "--text-column",
                     "caption", "--order", "sorted", "--quiet", "--workers", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    m = read_manifest(tmp_path / "p")
    assert m.classes == tuple(object_classes(3)) and set(m.sample.fields) == {"boxes", "text"}
    assert m.order["kind"] == "sorted" and m.source["layout"] == "parquet"
    res = run(main, ["build", pattern, "--out", str(tmp_path / "q"), "--image-column", "picture"])
    assert res.exit_code == 2 and "no column 'picture'" in res.output and "Traceback" not in res.output
    tars = write_tars(items, tmp_path / "tars")
    res = run(main, ["build", tars, "--out", str(tmp_path / "t"), "--box-format", "xywh", "--quiet"])
    assert res.exit_code == 0, res.output
    assert CachedDataset(tmp_path / "t")[0][1]["text"] == items[0].text


def test_object_storage_parquet_and_tars(objects, references, s3_options, tmp_path):
    import s3fs

    _, items = objects
    fs = s3fs.S3FileSystem(**s3_options)
    fs.mkdir("raw-src")
    write_parquet(items, tmp_path / "pq")
    write_tars(items, tmp_path / "tars")
    fs.put(str(tmp_path / "pq") + "/", "raw-src/pq/", recursive=True)
    fs.put(str(tmp_path / "tars") + "/", "raw-src/tars/", recursive=True)
    reference = CachedDataset(references("pt", "pixels"))
    for raw in ("s3://raw-src/pq/train-*.parquet", "s3://raw-src/tars/train-{000000..000001}.tar"):
        config = BuildConfig(**RECIPE, **QUIET, overwrite=True)
        result = build(raw, tmp_path / "remote", config, storage_options=s3_options, box_format="xywh")
        assert result.manifest.num_samples == len(items) and result.manifest.source["root"] == raw
        built = CachedDataset(tmp_path / "remote")
        for i in range(len(items)):
            assert np.array_equal(reference[i][0].numpy(), built[i][0].numpy())


def test_parquet_update_rebuilds_the_shards_of_the_file_that_changed(objects, tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, items = objects
    meta = {
        b"huggingface": json.dumps(
            {"info": {"features": {"label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}}
        ).encode()
    }

    def write(k: int, rows: list) -> None:
        table = pa.Table.from_pylist(rows).replace_schema_metadata(meta)
        pq.write_table(table, tmp_path / "pq" / f"train-{k}.parquet", row_group_size=3)

    (tmp_path / "pq").mkdir()
    rows = [
        {"image": {"bytes": Path(it.path).read_bytes(), "path": None}, "label": i % 2}
        for i, it in enumerate(items)
    ]
    write(0, rows[:4])
    write(1, rows[4:])
    config = BuildConfig(**RECIPE, workers=1, progress=False, shard_size=2)
    first = build(str(tmp_path / "pq" / "*.parquet"), tmp_path / "c", config)
    assert first.manifest.classes == ("cat", "dog") and first.manifest.order["kind"] == "sorted"
    assert [CachedDataset(tmp_path / "c")[i][1] for i in range(len(items))] == [
        i % 2 for i in range(len(items))
    ]
    write(1, [{**r, "label": 1 - r["label"]} for r in rows[4:]])
    again = build(
        str(tmp_path / "pq" / "*.parquet"), tmp_path / "c", BuildConfig(**{**config.__dict__, "update": True})
    )
    assert again.status == "updated" and (again.built_shards, again.reused_shards) == (2, 2)
    assert [CachedDataset(tmp_path / "c")[i][1] for i in range(4, len(items))] == [
        1 - i % 2 for i in range(4, len(items))
    ]
