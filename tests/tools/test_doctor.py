"""cachekit doctor: a slow step shows no stall, a fast step with in-process decoding a data bottleneck."""

from __future__ import annotations

import json
import time

import torch
from click.testing import CliRunner

from cachekit import CachedDataset
from cachekit.cli import main
from cachekit.tools.doctor import diagnose


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
