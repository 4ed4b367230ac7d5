"""``cachekit bench``: bad raw files skipped exactly as a build skips them, rows aligned on the same
images (checked pixel for pixel), and a chart whose words say what it shows."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import BAD_FILES, GOOD_FILES, ONE_WORKER_ROW_LABELS
from PIL import Image, PngImagePlugin

from cachekit import BuildConfig, CachedDataset, build
from cachekit.cli import main
from cachekit.constants import DIST_NAME
from cachekit.tools.baselines import RawImageDataset, check_raw_inputs
from cachekit.tools.bench import BenchConfig, run_bench
from cachekit.tools.benchsamples import align_samples, cache_pipeline
from cachekit.tools.benchview import bench_figure, format_table, plot_result

QUICK = BenchConfig(batch_size=4, workers=(0,), epochs=1, cold=False)


def _build(raw, out):
    build(raw, out, BuildConfig(size=32, workers=1, progress=False))
    return out


@pytest.fixture(scope="module")
def mixed_cache(mixed_tree, tmp_path_factory):
    return _build(mixed_tree, tmp_path_factory.mktemp("bench") / "cache")


@pytest.fixture(scope="module")
def mixed_result(mixed_tree, mixed_cache):
    """Both raw backends, in-process and one worker, a cold first epoch and a warm one."""
    return run_bench(mixed_tree, [mixed_cache], BenchConfig(batch_size=4, workers=(0, 1), epochs=2))


def _pil_unreadable_png() -> bytes:
    """A PNG whose text chunk has a bad CRC: libpng (a build) decodes it, PIL refuses it."""
    img = Image.fromarray(np.random.default_rng(3).integers(0, 256, (40, 50, 3), np.uint8))
    info = PngImagePlugin.PngInfo()
    info.add_text("comment", "hello")
    buf = io.BytesIO()
    img.save(buf, "PNG", pnginfo=info)
    data = bytearray(buf.getvalue())
    at = data.find(b"tEXt")
    data[at + 4 + struct.unpack(">I", data[at - 4 : at])[0]] ^= 0xFF
    return bytes(data)


def _assert_same_images(inputs, cache, alignment):
    """Every aligned pair is the same image: OpenCV on the raw file gives the cache's exact pixels."""
    raw_ds, ds = RawImageDataset(inputs, backend="opencv"), CachedDataset(cache)
    assert len(alignment.raw) == len(alignment.caches[0]) > 0
    for r, c in zip(alignment.raw, alignment.caches[0]):
        image, label = raw_ds[r]
        cached, cached_label = ds[c]
        assert np.array_equal(image.numpy(), cached.numpy()) and label == cached_label
    ds.close()


def test_bad_raw_files_are_skipped_as_a_build_skips_them(mixed_result, mixed_cache):
    manifest = CachedDataset(mixed_cache).manifest
    skipped = {s["path"]: s["reason"] for s in mixed_result["raw"]["skipped"]}
    assert skipped == {s.path: s.reason for s in manifest.skipped}  # same files, same words
    for path, word in BAD_FILES.items():
        assert word in skipped[path]
    assert mixed_result["raw"]["usable"] == len(GOOD_FILES) == mixed_result["samples"]
    assert mixed_result["aligned_by"] == "source path"  # the cache names each sample's source


@pytest.mark.parametrize("backend", ["pil", "opencv"])
def test_every_row_of_each_backend_reads_the_same_number_of_samples(mixed_result, backend):
    raw_rows = [r for r in mixed_result["rows"] if r["loader"] == f"raw-{backend}"]
    assert [r["workers"] for r in raw_rows] == [0, 1]
    for row in mixed_result["rows"]:
        counts = {e["samples"] for e in row["epochs"]}
        assert counts == {len(GOOD_FILES)}, row["loader"]
        assert row["samples_per_s"] > 0 and row["speedup"] > 0
    assert mixed_result["baseline"]["loader"].startswith("raw-")


def test_rows_read_the_same_images_by_position(mixed_tree, tmp_path, monkeypatch):
    """A cache that did not name its samples' sources is matched by position (path order)."""
    from cachekit.tools import benchsamples

    cache = tmp_path / "sorted"
    build(mixed_tree, cache, BuildConfig(size=32, order="sorted", workers=1, progress=False))
    monkeypatch.setattr(benchsamples, "_sample_sources", lambda ds: None)
    ds = CachedDataset(cache)
    inputs = check_raw_inputs(mixed_tree, cache_pipeline(ds), pil=True)
    alignment = align_samples(inputs, [ds])
    assert alignment.by == "position" and sorted(alignment.raw) == list(range(len(GOOD_FILES)))
    _assert_same_images(inputs, cache, alignment)


def test_a_file_pil_cannot_read_is_left_out_of_every_row(mixed_tree, tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(mixed_tree, raw, symlinks=True)
    (raw / "cat" / "bad_crc.png").write_bytes(_pil_unreadable_png())
    cache = _build(raw, tmp_path / "cache")
    assert len(CachedDataset(cache)) == len(GOOD_FILES) + 1  # a build keeps it
    ds = CachedDataset(cache)
    inputs = check_raw_inputs(raw, cache_pipeline(ds), pil=True, workers=2)
    assert [p for p, _ in inputs.refused] == ["cat/bad_crc.png"] and "PIL" in inputs.refused[0][1]
    alignment = align_samples(inputs, [ds])
    refused = inputs.paths.index("cat/bad_crc.png")
    in_cache = [ds.source(i) for i in range(len(ds))].index("cat/bad_crc.png")
    assert refused not in alignment.raw and in_cache not in alignment.caches[0]
    _assert_same_images(inputs, cache, alignment)
    result = run_bench(raw, [cache], BenchConfig(batch_size=4, workers=(0,), epochs=1, raw_backends=("pil",)))
    assert result["samples"] == len(GOOD_FILES)
    assert [s["path"] for s in result["raw"]["left_out_for_pil"]] == ["cat/bad_crc.png"]
    # without a PIL row nothing is left out: the OpenCV loader reads what a build reads
    result = run_bench(
        raw, [cache], BenchConfig(batch_size=4, workers=(0,), epochs=1, raw_backends=("opencv",))
    )
    assert result["samples"] == len(GOOD_FILES) + 1 and not result["raw"]["left_out_for_pil"]


def test_rows_are_matched_by_source_path_when_the_cache_names_sources(
    mixed_tree, mixed_cache, tmp_path, monkeypatch
):
    if not hasattr(CachedDataset, "source"):  # a cache built in sorted path order: sample i is GOOD_FILES[i]
        monkeypatch.setattr(CachedDataset, "source", lambda self, i: GOOD_FILES[i], raising=False)
    raw = tmp_path / "raw"
    shutil.copytree(mixed_tree, raw, symlinks=True)
    gone = ["cat/alpha.png", "dog/rotated.jpg"]
    for rel in gone:
        (raw / rel).unlink()
    ds = CachedDataset(mixed_cache)
    inputs = check_raw_inputs(raw, cache_pipeline(ds))
    alignment = align_samples(inputs, [ds])
    assert alignment.by == "source path" and len(alignment) == len(GOOD_FILES) - len(gone)
    _assert_same_images(inputs, mixed_cache, alignment)
    few = align_samples(inputs, [ds], samples=3)
    assert len(few) == 3 and few.raw == alignment.raw[:3]


def _assert_nothing_clipped(fig):
    """Every text lies inside the figure, and every bar's label inside the axes."""
    ax = fig.axes[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    whole, frame = fig.bbox, ax.get_window_extent(renderer)
    texts = [*ax.get_yticklabels(), *ax.texts, ax.xaxis.label, fig._suptitle]
    texts += [t for legend in fig.legends for t in legend.get_texts()]
    for t in texts:
        box = t.get_window_extent(renderer)
        assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0 and box.y1 <= whole.y1, t
    for t in ax.texts:
        assert t.get_window_extent(renderer).x1 <= frame.x1 + 1, t.get_text()


@pytest.mark.filterwarnings("error")  # a layout that collapses warns
def test_the_chart_says_what_it_shows(mixed_result, tmp_path):
    fig = bench_figure(mixed_result)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[:-1] == ONE_WORKER_ROW_LABELS
    # make_loader's choice in words, e.g. "(in-process + prefetch, 2 threads)", on one line
    assert labels[-1].startswith("pt cache, make_loader (in-process + prefetch") and "\n" not in labels[-1]
    assert len(set(labels)) == len(labels) and not any(":" in label for label in labels)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [
        "raw files, decoded every epoch",
        "cache, plain DataLoader",
        "cache, make_loader defaults",
    ]
    assert ax.get_xscale() == "linear" and "speed-up over the best raw loader" in ax.get_xlabel()
    bar_labels = [t.get_text() for t in ax.texts]
    for row, text in zip(mixed_result["rows"], bar_labels, strict=True):
        assert text.endswith(f"({row['samples_per_s']:,.0f} samples/s)") and "x  (" in text
    assert "1x = the best raw loader" in fig.get_suptitle()
    _assert_nothing_clipped(fig)
    out = plot_result(mixed_result, tmp_path / "bench.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.filterwarnings("error")
def test_caches_of_one_format_get_distinct_short_names(small_cache, tmp_path):
    for parent in ("a", "b"):
        shutil.copytree(small_cache, tmp_path / parent / "cache")
    result = run_bench(None, [tmp_path / "a" / "cache", tmp_path / "b" / "cache"], QUICK)
    names = [c["name"] for c in result["caches"]]
    assert names == ["cache-pt (a/cache)", "cache-pt (b/cache)"]
    fig = bench_figure(result)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(set(labels)) == len(labels) == 4
    assert "pt cache (b/cache), in-process" in labels
    assert "samples/s" in fig.axes[0].get_xlabel()  # no raw rows: plain samples/s
    _assert_nothing_clipped(fig)


def _cli(*args):
    result = CliRunner().invoke(main, ["bench", *map(str, args)])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("backend", ["pil", "opencv"])
def test_cli_says_how_many_were_skipped(mixed_tree, mixed_cache, backend, tmp_path):
    code, out, err = _cli(
        mixed_tree, mixed_cache, "--raw-backends", backend, "--workers", "0", "--epochs", "1",
        "--batch-size", "4", "--warm-only", "--json", tmp_path / "r.json",
    )  # fmt: skip
    assert code == 0, err
    assert f"a build keeps {len(GOOD_FILES)}" in out and f"skips {len(BAD_FILES)}" in out
    for path in BAD_FILES:
        assert f"skipped {path}" in err
    assert f"raw-{backend}" in out and "Traceback" not in out + err
    assert json.loads((tmp_path / "r.json").read_text())["samples"] == len(GOOD_FILES)


def test_plot_without_matplotlib_fails_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    code, out, err = _cli("--synthetic", 4, "--workdir", tmp_path / "w", "--plot", tmp_path / "p.png")
    assert code == 2 and err.strip() == f"error: --plot needs matplotlib: pip install '{DIST_NAME}[plot]'"
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_an_output_in_a_missing_folder_fails_before_any_work(tmp_path, flag):
    code, _, err = _cli("--synthetic", 4, "--workdir", tmp_path / "w", flag, tmp_path / "nope" / "out")
    assert code == 2 and "its folder does not exist" in err and not (tmp_path / "w").exists()


@pytest.mark.slow
def test_synthetic_shows_progress_and_compares_every_format(tmp_path):
    w = tmp_path / "w"
    code, out, err = _cli(
        "--synthetic", 6, "--workdir", w, "--workers", "0", "--epochs", "1", "--batch-size", "3",
        "--warm-only", "--json", tmp_path / "r.json", "--plot", tmp_path / "p.png",
    )  # fmt: skip
    assert code == 0, err
    for bar in ("writing JPEGs", "build", "checking raw files", "cache-zarr, in-process"):
        assert bar in err, bar
    result = json.loads((tmp_path / "r.json").read_text())
    assert {c["format"] for c in result["caches"]} == {"pt", "hdf5", "zarr"}
    assert result["samples"] == 6 and (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.parametrize("workers,augment", [("0", False), ("1", False), ("1", True)])
def test_a_raw_file_that_vanishes_mid_run_is_one_line(
    mixed_tree, mixed_cache, tmp_path, monkeypatch, workers, augment
):
    import cachekit.tools.bench as bench

    raw = tmp_path / "raw"
    shutil.copytree(mixed_tree, raw, symlinks=True)
    checked = bench.check_raw_inputs

    def check_then_delete(*args, **kwargs):
        inputs = checked(*args, **kwargs)
        (raw / "cat" / "photo.jpg").unlink()
        return inputs

    monkeypatch.setattr(bench, "check_raw_inputs", check_then_delete)
    more = ["--augment"] if augment else []
    code, out, err = _cli(
        raw, mixed_cache, "--workers", workers, "--epochs", "1", "--warm-only", "--quiet", *more
    )
    last = err.strip().splitlines()[-1]
    assert code == 1 and "Traceback" not in err, err
    assert last.startswith("error: ") and "cat/photo.jpg changed while the benchmark ran" in last


def test_an_augmented_cache_is_matched_on_its_inputs_first_variant(mixed_tree, tmp_path):
    cache = tmp_path / "aug"
    build(mixed_tree, cache, BuildConfig(size=32, workers=1, augment=3, progress=False))
    ds = CachedDataset(cache)
    inputs = check_raw_inputs(mixed_tree, cache_pipeline(ds))
    alignment = align_samples(inputs, [ds])
    assert len(alignment) == len(GOOD_FILES)
    for r, c in zip(alignment.raw, alignment.caches[0]):
        assert int(ds.extras(c)["variant"]) == 0 and ds.source(c) == inputs.paths[r]


def test_a_full_disk_for_the_json_is_one_line_after_the_table(small_tree, small_cache):
    code, out, err = _cli(
        small_tree, small_cache, "--raw-backends", "opencv", "--workers", "0", "--epochs", "1",
        "--samples", "8", "--warm-only", "--quiet", "--json", "/dev/full",
    )  # fmt: skip
    assert code == 1 and "raw-opencv" in out  # the figures were printed before
    assert err.strip().splitlines()[-1] == "error: cannot write /dev/full: disk full"
    assert Path("/dev/full").exists()


@pytest.mark.parametrize("target", ["folder", "read-only"])
def test_an_unwritable_output_fails_before_any_work(tmp_path, target):
    out = tmp_path / "out"
    if target == "folder":
        out.mkdir()
    else:
        out.write_text("old")
        out.chmod(0o444)
        if os.access(out, os.W_OK):
            pytest.skip("running as a user who may write anything")
    code, _, err = _cli("--synthetic", 4, "--workdir", tmp_path / "w", "--json", out)
    assert code == 2 and not (tmp_path / "w").exists(), err


def test_a_row_of_few_batches_says_its_speed_is_mostly_start_up(mixed_result):
    batches = -(-mixed_result["samples"] // 4)
    assert batches < 10
    (warning,) = [w for w in mixed_result["warnings"] if "batch" in w]
    assert f"only {batches} batches of 4 an epoch" in warning and "--samples" in warning
    assert f"warning: {warning}" in format_table(mixed_result)


def test_a_ratio_over_the_copy_limit_is_never_printed_as_a_result(mixed_tree, mixed_cache, monkeypatch):
    import cachekit.tools.bench as bench

    monkeypatch.setattr(bench, "memcpy_bandwidth", lambda: 1.0)  # any loader now beats "the copy limit"
    result = run_bench(None, [mixed_cache], QUICK)
    (key,) = [k for k in result["ratios"] if k.endswith("/ memcpy")]
    assert result["ratios"][key] > 1
    assert any(key in w and "cannot be trusted" in w for w in result["warnings"])
    line = next(line for line in format_table(result).splitlines() if line.startswith(key))
    assert line.endswith("(over the copy limit: cannot be trusted)")


def test_worker_rows_that_shm_cannot_serve_are_left_out_or_refused(mixed_cache, monkeypatch):
    import cachekit.feed.shm as shm
    from cachekit import UsageError

    monkeypatch.setattr(shm, "shm_free_bytes", lambda path=None: 1000)
    lines = []
    default = BenchConfig(batch_size=4, epochs=1, cold=False)
    result = run_bench(None, [mixed_cache], default, log=lines.append)
    assert {r["workers"] for r in result["rows"]} == {0, "make_loader"}
    assert any("no 2-worker rows" in line and "--shm-size" in line for line in lines)
    with pytest.raises(UsageError, match="--workers 2: /dev/shm has 0 MiB free"):
        run_bench(None, [mixed_cache], BenchConfig(batch_size=4, workers=(0, 2), epochs=1, cold=False))


def test_bench_synthetic_boxes_and_doctor_run_on_detection_caches(tmp_path):
    from cachekit.tools.benchsynthetic import bench_synthetic
    from cachekit.tools.doctor import diagnose

    config = BenchConfig(batch_size=4, workers=(0,), epochs=1, cold=False)
    result = bench_synthetic(12, config, workdir=tmp_path, formats=("pt",), boxes=True)
    assert result["synthetic"]["boxes"] and result["caches"][0]["pipeline"] == "letterbox-640"
    assert {r["loader"] for r in result["rows"]} == {"raw-opencv", "cache-pt"}  # PIL runs classification only
    cache = tmp_path / "boxes-pt"
    assert set(CachedDataset(cache).fields) == {"boxes"}
    report = diagnose(cache, batch_size=4, steps=4, step_ms=1.0)
    assert report.samples_per_s > 0


def _clocked(monkeypatch, seconds):
    """Every row's epochs take ``seconds`` in turn (epoch 1, then the warm ones), whatever the clock says."""
    import itertools

    import cachekit.tools.benchtiming as benchtiming

    real, calls = benchtiming.time_epoch, itertools.count()

    def timed(loader, limit, bar):
        rec = real(loader, limit, bar)
        rec["seconds"] = seconds[next(calls) % len(seconds)]
        return rec

    monkeypatch.setattr(benchtiming, "time_epoch", timed)


def test_each_row_is_the_median_of_its_warm_epochs_with_their_range(
    mixed_tree, mixed_cache, monkeypatch, tmp_path
):
    _clocked(monkeypatch, [9.0, 1.0, 2.0, 1.25])  # a slow cold epoch, then warm ones of 1, 2 and 1.25 s
    lines = []
    config = BenchConfig(batch_size=4, workers=(0,), cold=False, raw_backends=("opencv",), repeats=3)
    result = run_bench(mixed_tree, [mixed_cache], config, log=lines.append)
    assert result["repeats"] == 3 and result["config"]["repeats"] == 3
    baseline = result["baseline"]["samples_per_s"]
    for row in result["rows"]:
        n = row["epochs"][0]["samples"]
        assert len(row["epochs"]) == 4 and row["repeats"] == 3
        assert row["samples_per_s"] == pytest.approx(n / 1.25)  # the median, not the cold epoch
        assert row["samples_per_s_min"] == pytest.approx(n / 2) and row["samples_per_s_max"] == pytest.approx(
            n
        )
        assert row["speedup_min"] == pytest.approx(n / 2 / baseline)
        assert row["speedup_max"] == pytest.approx(n / baseline)
        assert row["spread"] == pytest.approx((n - n / 2) / (n / 1.25))
    spread = [w for w in result["warnings"] if "warm epochs ran" in w]
    assert len(spread) == len(result["rows"]) and all("\n" not in w and "62%" in w for w in spread)
    assert spread[0].startswith("raw-opencv, in-process: its 3 warm epochs ran")
    assert f"warning: {spread[0]}" in lines
    table = format_table(result)
    n = result["rows"][0]["epochs"][0]["samples"]
    assert f"{n / 1.25:,.0f} ({n / 2:,.0f}-{n:,.0f})" in table and "median of 3 warm epochs" in table
    json.dumps(result)  # what --json writes


@pytest.mark.parametrize("fastest,warns", [(1.3, True), (1.2, False)])
def test_a_spread_over_a_quarter_of_the_median_warns(mixed_cache, monkeypatch, fastest, warns):
    _clocked(monkeypatch, [1.0, 1.0, 1.0 / fastest, 1.0])  # warm: n, fastest * n, n samples/s
    result = run_bench(None, [mixed_cache], BenchConfig(batch_size=4, workers=(0,), cold=False))
    assert all(r["repeats"] == 3 and r["spread"] == pytest.approx(fastest - 1) for r in result["rows"])
    assert any("warm epochs ran" in w for w in result["warnings"]) == warns


def test_the_chart_draws_each_rows_range_as_an_error_bar(mixed_tree, mixed_cache, monkeypatch):
    from matplotlib.container import BarContainer

    _clocked(monkeypatch, [9.0, 1.0, 2.0, 1.25])
    config = BenchConfig(batch_size=4, workers=(0,), cold=False, raw_backends=("opencv",), repeats=3)
    for result in (run_bench(mixed_tree, [mixed_cache], config), run_bench(None, [mixed_cache], config)):
        fig = bench_figure(result)
        ax = fig.axes[0]
        (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
        relative = result["baseline"] is not None
        low, high = ("speedup_min", "speedup_max") if relative else ("samples_per_s_min", "samples_per_s_max")
        segments = bars.errorbar.lines[2][0].get_segments()
        assert len(segments) == len(result["rows"])
        for seg, row, patch in zip(segments, result["rows"], bars.patches):
            assert seg[0][0] == pytest.approx(row[low]) and seg[1][0] == pytest.approx(row[high])
            assert seg[0][0] < patch.get_width() < seg[1][0]  # the median inside its range
        assert "median of 3 warm epochs (bars: min-max)" in fig.get_suptitle()
        _assert_nothing_clipped(fig)


def test_repeats_on_the_command_line(small_tree, small_cache, tmp_path):
    assert BenchConfig().passes() == 1 + 3  # by default three warm epochs a row, after the first
    args = [small_tree, small_cache, "--raw-backends", "opencv", "--workers", "0", "--samples", "8",
            "--warm-only", "--quiet", "--batch-size", "4"]  # fmt: skip
    code, out, err = _cli(*args, "--repeats", "2", "--json", tmp_path / "r.json")
    assert code == 0, err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["repeats"] == 2 and all(len(r["epochs"]) == 3 and r["repeats"] == 2 for r in result["rows"])
    assert "median of 2 warm epochs" in out
    code, out, err = _cli(*args, "--epochs", "2", "--json", tmp_path / "r.json")
    assert code == 0 and json.loads((tmp_path / "r.json").read_text())["repeats"] == 1
    for bad, words in ((["--repeats", "0"], "--repeats must be at least 1"),
                       (["--repeats", "2", "--epochs", "3"], "not both")):  # fmt: skip
        code, out, err = _cli(*args, *bad)
        assert code == 2 and words in err and err.strip().count("\n") == 0, err


def test_a_result_written_before_repeats_still_draws_and_prints(mixed_result):
    """An older --json (one warm figure a row, no range) is shown as it is: no range, no error."""
    import copy

    from matplotlib.container import BarContainer

    old = copy.deepcopy(mixed_result)
    old.pop("repeats")
    for row in old["rows"]:
        for key in (
            "samples_per_s_min",
            "samples_per_s_max",
            "speedup_min",
            "speedup_max",
            "repeats",
            "spread",
        ):
            row.pop(key)
    row = old["rows"][0]
    speed = f"{row['samples_per_s']:,.0f}"
    assert f"{speed} ({speed}-{speed})" in format_table(old)
    fig = bench_figure(old)
    (bars,) = [c for c in fig.axes[0].containers if isinstance(c, BarContainer)]
    for seg, patch in zip(bars.errorbar.lines[2][0].get_segments(), bars.patches):
        assert seg[0][0] == pytest.approx(patch.get_width()) == pytest.approx(seg[1][0])
    assert "warm epochs" in fig.get_suptitle() and "median of" not in fig.get_suptitle()
