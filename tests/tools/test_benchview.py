"""A bench result shown: the table's figures (each row's median warm epoch and its range), the words
rows are named with, and the chart's bars and error bars, from a result as ``run_bench`` writes it."""

from __future__ import annotations

import copy

import pytest

from cachekit.tools.benchview import (
    _factor,
    augment_text,
    bench_figure,
    cache_names,
    format_table,
    loader_text,
    shape_text,
    workers_text,
)


def _row(loader, workers, median, lo, hi, baseline=None, **more) -> dict:
    row = {
        "loader": loader,
        "workers": workers,
        "epoch1_samples_per_s": median / 2,
        "samples_per_s": median,
        "samples_per_s_min": lo,
        "samples_per_s_max": hi,
        "MB_per_s": median * 0.15,
        "first_batch_s": 0.0123,
        "repeats": 3,
        "spread": (hi - lo) / median,
        **more,
    }
    if baseline:
        row.update(speedup=median / baseline, speedup_min=lo / baseline, speedup_max=hi / baseline)
    return row


@pytest.fixture
def result() -> dict:
    """Two raw rows and two cache rows, the best raw one the baseline (1,000 samples/s)."""
    base = 1000.0
    return {
        "rows": [
            _row("raw-pil", 0, 800.0, 700.0, 900.0, base),
            _row("raw-opencv", 2, base, 950.0, 1100.0, base),
            _row("cache-pt", 0, 40_000.0, 30_000.0, 44_000.0, base),
            _row("cache-pt", "make_loader", 150_000.0, 120_000.0, 160_000.0, base,
                 mode="in-process batched reads prefetch thread"),
        ],  # fmt: skip
        "baseline": {"loader": "raw-opencv", "workers": 2, "samples_per_s": base},
        "repeats": 3,
        "samples": 512,
        "aligned_by": "source path",
        "config": {"batch_size": 64},
        "machine": {"cpus_usable": 4, "memcpy_MB_per_s": 9000.0},
        "raw": {"found": 520, "usable": 512, "bytes": 3 * 2**20, "skipped": ["a", "b"], "left_out_for_pil": []},
        "caches": [{"format": "pt", "pipeline": "train-256", "shape": [3, 256, 256], "bytes": 2**30,
                    "samples": 512, "path": "/data/cache"}],  # fmt: skip
        "ratios": {"cache-pt / memcpy": 0.5, "make_loader / memcpy": 1.5},
        "warnings": ["raw-pil, in-process: its 3 warm epochs ran 700-900 samples/s"],
    }


def test_the_table_gives_each_rows_median_with_its_range_and_says_so(result):
    table = format_table(result).splitlines()
    head = table[0].split()
    assert head[:4] == ["loader", "workers", "epoch", "1/s"] and "speed-up" in head
    rows = {line.split("  ")[0]: line for line in table[2:6]}
    assert "800 (700-900)" in rows["raw-pil"] and "0.80x" in rows["raw-pil"] and "in-process" in rows["raw-pil"]
    assert "1,000 (950-1,100)" in rows["raw-opencv"] and "1.0x" in rows["raw-opencv"]
    assert "2 workers" in rows["raw-opencv"] and "0.012 s" in rows["raw-opencv"] and " 150 " in rows["raw-opencv"]
    cache = [line for line in table[2:6] if line.startswith("cache-pt")]
    assert "40,000 (30,000-44,000)" in cache[0] and "40x" in cache[0] and "20,000" in cache[0]
    assert "150,000 (120,000-160,000)" in cache[1] and "150x" in cache[1]
    assert "make_loader (in-process prefetch)" in cache[1]
    text = "\n".join(table)
    assert "warm/s: the median of 3 warm epochs (their min-max)" in text
    assert "speed-up: median warm samples/s over the best raw loader (raw-opencv, 2 workers, 1,000 samples/s)" in text
    assert "512 samples per epoch in every row (matched by source path), batch 64, 4 usable CPUs" in text
    assert "raw:   520 image files: a build keeps 512 (3.1 MB) and skips 2" in text and "left out" not in text
    assert "cache: 1.1 GB (pt, train-256, 256x256, 512 samples) /data/cache" in text
    assert "cache-pt / memcpy: 0.50\n" in text + "\n"
    assert "make_loader / memcpy: 1.50 (over the copy limit: cannot be trusted)" in text
    assert table[-1] == "warning: raw-pil, in-process: its 3 warm epochs ran 700-900 samples/s"
    one = copy.deepcopy(result)
    one["repeats"] = 1
    one["raw"].update(unit="records", left_out_for_pil=["c"])
    text = format_table(one)
    assert "the median of 1 warm epoch (their min-max)" in text and "520 records" in text
    assert "; 1 left out of every row (PIL cannot read them)" in text


def test_a_row_without_a_speed_up_shows_a_dash(result):
    for row in result["rows"]:
        row.pop("speedup")
    result.pop("baseline")
    lines = format_table(result).splitlines()
    assert all(line.rstrip().endswith(" -") for line in lines[2:6]) and "speed-up:" not in "\n".join(lines)


@pytest.mark.parametrize(
    "x, text", [(150.4, "150x"), (10.0, "10x"), (9.96, "10.0x"), (2.345, "2.3x"), (1.0, "1.0x"), (0.456, "0.46x")]
)
def test_speed_ups_are_shown_to_two_figures_or_whole(x, text):
    assert _factor(x) == text


def test_the_words_of_rows_caches_and_crops():
    assert workers_text({"workers": 0}) == "in-process"
    assert workers_text({"workers": 1}) == "1 worker" and workers_text({"workers": 3}) == "3 workers"
    assert workers_text({"workers": "make_loader"}) == "make_loader"
    mode = "2 worker processes batched reads; augment on CPU threads"
    assert workers_text({"workers": "make_loader", "mode": mode}) == "make_loader (2 workers)"
    mode = "in-process, 4 threads over each batch; augment on cuda:0"
    assert workers_text({"workers": "make_loader", "mode": mode}) == "make_loader (in-process, 4 threads, augment on cuda:0)"
    assert loader_text("raw-pil") == "raw files, PIL" and loader_text("raw-opencv") == "raw files, OpenCV"
    assert loader_text("raw-parquet") == "raw files, parquet" and loader_text("ffcv") == "ffcv"
    assert loader_text("cache-pt") == "pt cache" and loader_text("cache-lmdb (a/b)") == "lmdb cache (a/b)"
    assert cache_names(["/x/a/c", "/x/b/c", "/y/z"], ["pt", "pt", "lmdb"]) == [
        "cache-pt (a/c)", "cache-pt (b/c)", "cache-lmdb"
    ]  # fmt: skip
    assert cache_names(["/x/c/", "/x/c"], ["pt", "pt"]) == ["cache-pt (/x/c) #1", "cache-pt (/x/c) #2"]
    assert shape_text([3, 224, 256]) == "224x256" and shape_text([3, None, None]) == "variable size"
    assert augment_text([224, 224]) == "RandomResizedCrop(224) + horizontal flip"
    assert augment_text([128, 96]) == "RandomResizedCrop(128x96) + horizontal flip"
    assert augment_text({"augment": None}) is None and augment_text({"augment": {"spec": "Flip()"}}) == "Flip()"
    assert augment_text({"augment": {"spec": None, "size": [64, 64]}}).startswith("RandomResizedCrop(64)")


def test_the_table_of_an_augmented_result_says_what_every_row_does(result):
    how = {"raw": "decode, then crop in PIL", "make_loader": "batched on threads"}
    result["augment"] = {"size": [96, 128], "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "flip_p": 0.5, "how": how}
    result["caches"][0]["pipeline"] = None
    result["repeats"] = 2
    lines = format_table(result).splitlines()
    assert lines[0] == "augmented rows: every row does RandomResizedCrop(96x128) + horizontal flip per sample"
    assert lines[1].split("  ")[0] == "loader" and "warm/s (min-max)" in lines[1] and lines[2].startswith("-" * 10)
    assert lines[1].split() == ["loader", "workers", "epoch", "1/s", "warm/s", "(min-max)", "MB/s", "1st",
                                "batch", "speed-up"]  # fmt: skip
    assert all(len(line) == len(lines[2]) for line in lines[1:3]) and set(lines[2]) == {"-", " "}
    assert lines[7] == "" and lines[8].startswith("512 samples per epoch")
    text = "\n".join(lines)
    assert "the median of 2 warm epochs (their min-max)" in text
    assert "cache: 1.1 GB (pt, 256x256, 512 samples) /data/cache" in text
    assert "augment: crops of 96x128, scale (0.08, 1.0), ratio (0.75, 1.33), flip p 0.5" in text
    assert "  raw: decode, then crop in PIL\n  make_loader: batched on threads" in text
    result["augment"] = {"spec": "RandomHorizontalFlip(p=0.5)", "size": [96, 128], "how": how}
    text = format_table(result)
    assert text.startswith("augmented rows: make_loader(augment=[RandomHorizontalFlip(p=0.5)]), batched")
    assert "augment: RandomHorizontalFlip(p=0.5) (output 96x128)" in text and "crops of" not in text


@pytest.mark.parametrize("relative", [True, False])
def test_the_chart_draws_each_bar_at_its_median_with_its_range(result, relative):
    from matplotlib.container import BarContainer

    if not relative:
        for row in result["rows"]:
            row.pop("speedup")
    fig = bench_figure(result)
    ax = fig.axes[0]
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    segments = bars.errorbar.lines[2][0].get_segments()
    scale = 1000.0 if relative else 1.0
    for seg, row, patch in zip(segments, result["rows"], bars.patches, strict=True):
        assert patch.get_width() == pytest.approx(row["samples_per_s"] / scale)
        assert seg[0][0] == pytest.approx(row["samples_per_s_min"] / scale)
        assert seg[1][0] == pytest.approx(row["samples_per_s_max"] / scale)
    ys = [patch.get_y() + patch.get_height() / 2 for patch in bars.patches]
    assert ys == sorted(ys, reverse=True) and ys[-1] == 0  # the first row at the top
    assert ys[0] - ys[1] == 1.5 and ys[2] - ys[3] == 1.0  # half a row more between loaders
    title = fig.get_suptitle()
    assert "512 samples of 256x256, batch 64, median of 3 warm epochs (bars: min-max), 4 usable CPUs" in title
    assert ("1x = the best raw loader: raw files, OpenCV, 2 workers, 1,000 samples/s" in title) == relative
    texts = [t.get_text() for t in ax.texts]
    if relative:
        assert texts[2] == "40x  (40,000 samples/s)" and texts[0] == "0.80x  (800 samples/s)"
        assert ax.get_xlabel() == "speed-up over the best raw loader (x, linear scale)"
    else:
        assert texts[2] == "40,000 samples/s" and ax.get_xlabel() == "samples/s (linear scale)"
    assert ax.get_xlim()[1] >= 160 if relative else ax.get_xlim()[1] >= 160_000  # every range inside
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["raw files, decoded every epoch", "cache, plain DataLoader", "cache, make_loader defaults"]


def test_a_result_of_one_warm_figure_a_row_draws_no_range(result):
    for row in result["rows"]:
        for key in ("samples_per_s_min", "samples_per_s_max", "speedup_min", "speedup_max"):
            row.pop(key)
    result.pop("repeats")
    fig = bench_figure(result)
    assert "warm epochs, 4 usable CPUs" in fig.get_suptitle()
    assert "1,000 (1,000-1,000)" in format_table(result)
