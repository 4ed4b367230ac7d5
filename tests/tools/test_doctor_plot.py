"""cachekit doctor --plot: the picture of the timed steps shows doctor's own figures, and stalls that recur."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from cachekit.cli import main
from cachekit.constants import DIST_NAME
from cachekit.tools.doctor import DoctorReport, diagnose
from cachekit.tools.doctorplot import DPI, FIGSIZE, STEP_LABEL, WAIT_LABEL, doctor_figure, stall_pattern

SIZE = (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))


def _bars(figure, label: str):
    (container,) = [c for c in figure.axes[0].containers if c.get_label() == label]
    return list(container)


def _has_colour(png: Image.Image, rgb: tuple[int, int, int]) -> bool:
    pixels = np.asarray(png.convert("RGB")).reshape(-1, 3).astype(int)
    return bool((np.abs(pixels - rgb).sum(axis=1) < 12).any())


def test_the_picture_plots_the_steps_doctor_timed(small_cache, tmp_path):
    out = tmp_path / "wait.png"
    report = diagnose(small_cache, batch_size=8, steps=6, step_ms=5, plot=out)
    assert len(report.start_s) == len(report.wait_s) == len(report.step_s) == 6
    assert report.start_s[0] == 0.0 and report.start_s == sorted(report.start_s)
    png = Image.open(out)
    assert png.format == "PNG" and png.size == SIZE
    assert _has_colour(png, (0xD6, 0x27, 0x28)) or report.stall < 0.01  # waits drawn red where there are any
    assert _has_colour(png, (0x1F, 0x5F, 0xA8))  # the steps' compute, blue
    figure = doctor_figure(report)
    work, waits = _bars(figure, STEP_LABEL), _bars(figure, WAIT_LABEL)
    assert [b.get_x() for b in work] == pytest.approx(report.start_s)
    assert [b.get_height() for b in work] == pytest.approx([1e3 * s for s in report.step_s])
    assert [b.get_height() for b in waits] == pytest.approx([1e3 * w for w in report.wait_s])
    assert [b.get_y() for b in waits] == pytest.approx(
        [1e3 * s for s in report.step_s]
    )  # stacked on its step
    spans = [w + s for w, s in zip(report.wait_s, report.step_s)]
    assert [b.get_width() for b in waits] == pytest.approx(spans)
    said = " ".join(t.get_text() for ax in figure.axes for t in ax.texts)
    assert f"{report.stall:.0%} of the time" in said and "GPU utilisation not measured" in said
    timeline = report.to_json()["timeline"]
    assert timeline["wait_s"] == report.wait_s and timeline["gpu_utilisation"] is None


def test_the_cli_writes_the_picture_and_refuses_what_it_cannot_write_before_the_run(small_cache, tmp_path):
    out = tmp_path / "wait.png"
    args = ["doctor", str(small_cache), "--batch-size", "8", "--steps", "3", "--step-ms", "2"]
    result = CliRunner().invoke(main, [*args, "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert f"picture:     {out}" in result.output and Image.open(out).size == SIZE
    missing = CliRunner().invoke(main, [*args, "--plot", str(tmp_path / "nope" / "w.png")])
    assert missing.exit_code == 2 and missing.output.strip().count("\n") == 0
    assert "its folder does not exist" in missing.output and "waiting:" not in missing.output


def test_plot_without_matplotlib_is_one_line_before_the_run(small_cache, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    result = CliRunner().invoke(
        main, ["doctor", str(small_cache), "--steps", "2", "--plot", str(tmp_path / "p.png")]
    )
    assert result.exit_code == 2 and "waiting:" not in result.output
    assert result.output.strip() == f"error: --plot needs matplotlib: pip install '{DIST_NAME}[plot]'"


def _report(wait_s, step_s, gpu=None, epoch_batches=0) -> DoctorReport:
    starts, t = [], 0.0
    for w, s in zip(wait_s, step_s):
        starts.append(t)
        t += w + s
    return DoctorReport(cache="/data/train", batch_size=64, steps=len(wait_s), mode="4 worker processes",
                        workers=4, prefetch_factor=2, pin_memory=True, first_batch_s=0.5, wait_s=wait_s,
                        step_s=step_s, cpu_percent={}, step="model net, trained on cuda", start_s=starts,
                        gpu_trace=gpu, epoch_batches=epoch_batches)  # fmt: skip


def test_a_pool_that_refills_every_few_batches_is_named_periodic_and_marked():
    waits = [0.060 if i % 4 == 3 else 0.001 for i in range(40)]
    pattern = stall_pattern(waits, [0.02] * 40)
    assert pattern.stalled == list(range(3, 40, 4)) and pattern.period == 4
    report = _report(waits, [0.02] * 40, gpu=[(0.05 * k, 90.0 if k % 5 else 5.0) for k in range(48)])
    figure = doctor_figure(report)
    said = " ".join(t.get_text() for t in figure.axes[0].texts)
    assert (
        "data bottleneck" in said and "repeat every 4 steps" in said and "10 of 40 steps waited 60 ms" in said
    )
    (stalls,) = [line for line in figure.axes[0].lines if line.get_label() == "a stall"]
    assert len(stalls.get_xdata()) == 10
    (gpu,) = figure.axes[1].lines
    assert list(gpu.get_ydata()) == [u for _, u in report.gpu_trace]
    once_an_epoch = stall_pattern([0.09 if i % 10 == 0 else 0.001 for i in range(40)], [0.02] * 40)
    assert once_an_epoch.period == 10
    assert "one epoch of 10 batches" in once_an_epoch.text(
        [0.09 if i % 10 == 0 else 0.001 for i in range(40)], 10
    )


def test_steady_waits_and_scattered_ones_are_not_called_periodic():
    rng = np.random.default_rng(0)
    steady = stall_pattern(list(0.001 + 0.0002 * rng.random(40)), [0.02] * 40)
    assert steady.stalled == [] and steady.period is None and steady.text([0.001] * 40) is None
    scattered = [0.0] * 40
    for i in (2, 9, 13, 27, 38):
        scattered[i] = 0.05
    pattern = stall_pattern(scattered, [0.02] * 40)
    assert pattern.stalled == [2, 9, 13, 27, 38] and pattern.period is None
    assert pattern.text(scattered).startswith("stalls at no regular spacing")
    keeps_up = doctor_figure(_report([0.0005] * 20, [0.05] * 20))
    assert "data keeps up" in " ".join(t.get_text() for t in keeps_up.axes[0].texts)
