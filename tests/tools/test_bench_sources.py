"""``cachekit bench`` takes Parquet files, tars and Python datasets as its raw baseline: every raw row
reads the cache's own samples, decoded from the records as the build read them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build"))
from sourcekit import FileDataset, make_objects, write_parquet, write_tars  # noqa: E402

from cachekit import BuildConfig, build  # noqa: E402
from cachekit.image.recipes import load_pipeline  # noqa: E402
from cachekit.tools.baselines import check_raw_inputs  # noqa: E402
from cachekit.tools.bench import BenchConfig, run_bench  # noqa: E402
from cachekit.tools.benchview import format_table  # noqa: E402
from cachekit.tools.report import human_bytes  # noqa: E402

CONFIG = BenchConfig(batch_size=2, workers=(1,), epochs=1, cold=False)  # a worker process: the reads pickled


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_objects(tmp_path_factory.mktemp("objects") / "raw", 6)


@pytest.mark.parametrize(
    "kind",
    ["parquet", pytest.param("tar", marks=pytest.mark.slow), pytest.param("dataset", marks=pytest.mark.slow)],
)
def test_bench_reads_a_record_source_as_its_raw_baseline(objects, tmp_path, kind):
    _, items = objects
    if kind == "parquet":
        raw = write_parquet(items, tmp_path / "pq")
    elif kind == "tar":
        raw = write_tars(items, tmp_path / "tars")
    else:
        raw = FileDataset([it.path for it in items], ["a", "b"])
    build(raw, tmp_path / "c", BuildConfig(size=32, workers=1, progress=False), box_format="xywh")
    result = run_bench(raw, [tmp_path / "c"], CONFIG)
    rows = {(r["loader"], r["workers"]) for r in result["rows"]}
    assert {("raw-pil", 1), ("raw-opencv", 1)} <= rows
    assert all(r["samples_per_s"] > 0 for r in result["rows"])
    if kind != "dataset":  # the bytes read are the files' own, each counted once
        folder = tmp_path / ("pq" if kind == "parquet" else "tars")
        total = sum(p.stat().st_size for p in folder.iterdir())
        assert result["raw"]["bytes"] == total
        assert (
            f"raw:   {len(items)} records: a build keeps {len(items)} ({human_bytes(total)})"
            in format_table(result)
        )


@pytest.mark.parametrize("kind", ["parquet", "tar", "folder"])
def test_the_raw_bytes_are_the_size_of_the_files_read(objects, tmp_path, kind):
    """A file of records counts once, not once per record (6 rows of a 3 kB Parquet file were 18 kB)."""
    root, items = objects
    if kind == "parquet":
        raw, folder = write_parquet(items, tmp_path / "pq", files=2), tmp_path / "pq"
    elif kind == "tar":
        raw, folder = write_tars(items, tmp_path / "tars", files=2), tmp_path / "tars"
    else:
        raw, folder = root / "images", root / "images"
    files = [p for p in folder.rglob("*") if p.is_file()]
    inputs = check_raw_inputs(raw, load_pipeline("none"), discover_options={"source": {"box_format": "xywh"}})
    assert len(inputs) == len(items) and len(files) == (2 if kind != "folder" else len(items))
    assert inputs.bytes == sum(p.stat().st_size for p in files)
