"""``cachekit bench`` takes Parquet files, tars and Python datasets as its raw baseline: every raw row
reads the cache's own samples, decoded from the records as the build read them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "build"))
from sourcekit import FileDataset, make_objects, write_parquet, write_tars  # noqa: E402

from cachekit import BuildConfig, build  # noqa: E402
from cachekit.tools.bench import BenchConfig, run_bench  # noqa: E402

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
