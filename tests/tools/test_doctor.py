"""cachekit doctor: it measures the stall, the disk and the CPU before it advises."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from cachekit import CachedDataset, UsageError
from cachekit.cli import main
from cachekit.tools.benchtiming import drop_page_cache
from cachekit.tools.counters import process_counters
from cachekit.tools.doctor import diagnose, load_model, simulated_step
from cachekit.tools.synthetic import write_synthetic_cache


def tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 4))


def slow_transform(image: torch.Tensor) -> torch.Tensor:
    time.sleep(0.002)  # stands for JPEG decoding or augmentation: CPU work per sample
    return image


def test_a_slow_step_is_not_waiting_for_a_pixel_cache(small_cache):
    report = diagnose(small_cache, batch_size=8, steps=10, step_ms=40)
    assert report.workers == 0 and "prefetch thread" in report.mode
    assert len(report.wait_s) == 10 and report.stall < 0.10
    assert "data keeps up" in report.recommendations[0]
    assert report.samples_per_s > 0 and "main process" in report.cpu_percent


def test_a_fast_step_with_in_process_decoding_is_a_data_bottleneck(small_cache):
    ds = CachedDataset(small_cache, transform=slow_transform)
    report = diagnose(ds, batch_size=8, steps=8, step_ms=0.0, workers=0)
    assert report.stall > 0.5
    advice = " ".join(report.recommendations)
    assert "data bottleneck" in advice and "worker processes" in advice


def test_worker_processes_are_measured(small_cache):
    ds = CachedDataset(small_cache, transform=slow_transform)
    report = diagnose(ds, batch_size=8, steps=8, step_ms=1.0, workers=2)
    workers = [k for k in report.cpu_percent if k.startswith("worker")]
    assert report.workers == 2 and len(workers) == 2


def test_cli_with_a_real_model(small_cache, tmp_path):
    out = tmp_path / "doctor.json"
    args = [
        "doctor",
        str(small_cache),
        "--batch-size",
        "8",
        "--steps",
        "5",
        "--model",
        "test_doctor:tiny_model",
    ]
    result = CliRunner().invoke(main, [*args, "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "waiting:" in result.output and "advice:" in result.output
    figures = json.loads(out.read_text())
    assert 0 <= figures["stall"] <= 1 and figures["steps"] == 5
    bad = CliRunner().invoke(main, ["doctor", str(small_cache), "--model", "nope"])
    assert bad.exit_code == 2 and "MODULE:FUNCTION" in bad.output


def _page_cache_can_be_dropped(folder: Path) -> bool:
    """True where dropping a file's pages makes the next read come from storage, as measured."""
    probe = folder / "probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    if process_counters().read_bytes is None or not drop_page_cache([probe]):
        return False
    before = process_counters().read_bytes
    probe.read_bytes()
    return process_counters().read_bytes - before >= 1 << 19


def test_the_disk_is_blamed_only_when_it_was_read(tmp_path):
    # 50 shards: the loader keeps opening new ones through the timed steps
    cache = write_synthetic_cache(tmp_path / "c", 800, side=64, shard_size=16)
    warm = diagnose(cache, batch_size=16, steps=30, step_ms=0)  # just written: in the page cache
    assert warm.stall > 0.10 and warm.disk_read_bytes in (0, None)
    assert not any("disk is the limit" in a for a in warm.recommendations)
    if not _page_cache_can_be_dropped(tmp_path):
        pytest.skip("the page cache cannot be dropped (or storage reads measured) on this system")
    assert drop_page_cache(sorted(cache.iterdir()))  # as bench makes an epoch cold
    cold = diagnose(cache, batch_size=16, steps=30, step_ms=0)
    assert cold.disk_share > 0.2 and cold.stall > 0.10
    assert "the disk is the limit" in cold.recommendations[1]
    assert "read from storage" in cold.summary() and "major page faults" in cold.summary()


def test_a_busy_step_holds_the_cpu_and_a_sleeping_one_does_not():
    used = {}
    for kind in ("busy", "sleep"):
        step = simulated_step(50, kind)
        before = time.thread_time()
        step(None, None)
        used[kind] = time.thread_time() - before
    assert used["busy"] > 10 * used["sleep"]
    with pytest.raises(UsageError, match="step-kind"):
        simulated_step(10, "nap")
    with pytest.raises(UsageError, match="step-ms"):
        simulated_step(float("nan"))


def test_the_report_says_what_the_step_was(small_cache):
    report = diagnose(small_cache, batch_size=8, steps=3)
    assert report.step.startswith("simulated 100 ms, busy") and report.step_kind == "busy"
    assert report.step_s and min(report.step_s) >= 0.09
    assert "step:        simulated 100 ms, busy" in report.summary()
    assert "--step-kind" in CliRunner().invoke(main, ["doctor", "--help"]).output
    assert "default: 100" in CliRunner().invoke(main, ["doctor", "--help"]).output
    with pytest.raises(UsageError, match="not both"):
        diagnose(small_cache, step_ms=10, model=tiny_model)


def test_model_modules_are_found_in_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "doctor_model_here.py").write_text(
        "import torch\n\ndef build():\n    return torch.nn.Flatten()\n"
    )
    # as under the installed command: neither the current folder nor "" on sys.path
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    assert isinstance(load_model("doctor_model_here:build")(), torch.nn.Flatten)
    with pytest.raises(UsageError, match="no_such_module"):
        load_model("no_such_module:build")


def test_the_loader_timed_runs_the_training_runs_augmentation(small_cache):
    report = diagnose(
        small_cache,
        batch_size=8,
        steps=3,
        step_ms=1.0,
        augment="RandomResizedCrop(16), RandomHorizontalFlip()",
    )
    assert "augment on CPU threads" in report.mode
    with pytest.raises(UsageError, match="unknown transform 'Nope'"):
        diagnose(small_cache, batch_size=8, steps=3, augment="Nope()")
    result = CliRunner().invoke(main, ["doctor", str(small_cache), "--steps", "2", "--step-ms", "1", "--batch-size", "8",
                                       "--augment", "RandomResizedCrop(16)"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "augment on CPU threads" in result.output
    result = CliRunner().invoke(main, ["doctor", str(small_cache), "--augment", "os.system('true')"])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_an_augment_the_cache_cannot_take_is_one_line_not_a_traceback(small_cache):
    # a list whose size varies per sample (refused by make_loader) went up as a ValueError traceback
    with pytest.raises(UsageError, match="different size for each sample"):
        diagnose(small_cache, batch_size=4, steps=2, step_ms=1.0, augment="RandomZoomOut()")
    result = CliRunner().invoke(main, ["doctor", str(small_cache), "--augment", "RandomZoomOut()"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0 and "different size for each sample" in result.output


def test_crops_from_a_cache_of_planes_are_pointed_to_the_channels_last_store(small_cache, tmp_path):
    from cachekit import BuildConfig, build
    from cachekit.tools.advice import advise
    from cachekit.tools.doctor import DoctorReport
    from cachekit.transforms import RandomHorizontalFlip, RandomResizedCrop

    starved = DoctorReport(cache=str(small_cache), batch_size=8, steps=4, mode="in-process", workers=0,
                           prefetch_factor=2, pin_memory=False, first_batch_s=0.1, wait_s=[0.05] * 4,
                           step_s=[0.001] * 4, cpu_percent={"main process": 190.0})  # fmt: skip
    crops = [RandomResizedCrop(24), RandomHorizontalFlip()]
    advice = " ".join(advise(starved, CachedDataset(small_cache), False, augment=crops))
    assert "--store pixels-hwc" in advice and "channels_last=True" in advice
    assert "pixels-hwc" not in " ".join(advise(starved, CachedDataset(small_cache), False))  # no crops
    raw = Path(CachedDataset(small_cache).manifest.source["root"])
    build(raw, tmp_path / "hwc", BuildConfig(size=32, store="pixels-hwc", workers=1, progress=False))
    assert "pixels-hwc" not in " ".join(
        advise(starved, CachedDataset(tmp_path / "hwc"), False, augment=crops)
    )
