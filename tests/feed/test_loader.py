"""make_loader, suggest_num_workers (with fake cgroup files) and the DDP example under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from cachekit import CachedDataset, cpus, make_loader, suggest_num_workers


@pytest.fixture
def fake_cgroup(tmp_path, monkeypatch):
    root = tmp_path / "cgroup"
    root.mkdir()
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/\n")
    monkeypatch.setattr(cpus, "CGROUP_ROOT", str(root))
    monkeypatch.setattr(cpus, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    return root


def test_cpus_follow_affinity_without_a_quota(fake_cgroup):
    (fake_cgroup / "cpu.max").write_text("max 100000\n")
    assert cpus.available_cpus() == 8


def test_cgroup_v2_quota_caps_the_cpus(fake_cgroup):
    (fake_cgroup / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs
    assert cpus.available_cpus() == 3
    assert suggest_num_workers(64) == 3
    assert suggest_num_workers(64, world_size=2) == 1
    assert suggest_num_workers(64, max_workers=2) == 2
    assert suggest_num_workers(1) == 0


def test_cgroup_v2_quota_of_the_process_own_group(fake_cgroup, tmp_path):
    (tmp_path / "proc_cgroup").write_text("0::/kubepods/pod1\n")
    (fake_cgroup / "kubepods" / "pod1").mkdir(parents=True)
    (fake_cgroup / "kubepods" / "pod1" / "cpu.max").write_text("100000 100000\n")
    assert cpus.available_cpus() == 1


def test_cgroup_v1_quota_caps_the_cpus(fake_cgroup):
    (fake_cgroup / "cpu").mkdir()
    (fake_cgroup / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (fake_cgroup / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpus.available_cpus() == 4
    (fake_cgroup / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert cpus.available_cpus() == 8


def test_pixel_cache_reads_in_process_with_a_prefetch_thread(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=8)
    assert isinstance(loader, DataLoader) and loader.num_workers == 0
    assert "prefetch thread" in loader.mode and loader.pin_memory == torch.cuda.is_available()
    seen = []
    reference = ds.read_batch(list(range(len(ds))))[0]
    for images, labels in loader:
        assert images.dtype == torch.uint8 and labels.dtype == torch.int64
        seen += [next(i for i in range(len(ds)) if torch.equal(reference[i], img)) for img in images]
    assert sorted(seen) == list(range(len(ds)))


def test_transforms_get_worker_processes(small_cache):
    ds = CachedDataset(small_cache, transform=lambda x: x)
    loader = make_loader(ds, batch_size=8, shuffle=False)
    assert loader.num_workers == suggest_num_workers(8) and loader.num_workers > 0
    assert loader.persistent_workers and "worker processes" in loader.mode
    assert sum(len(b[0]) for b in loader) == len(ds)


def test_device_conversion_normalises_with_the_cache_stats(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=40, shuffle=False, device="cpu", normalize=True)
    images, _ = next(iter(loader))
    assert images.dtype == torch.float32
    mean = torch.tensor(ds.manifest.mean).view(1, 3, 1, 1)
    std = torch.tensor(ds.manifest.std).view(1, 3, 1, 1)
    raw = ds.read_batch(range(40))[0].float() / 255
    torch.testing.assert_close(images, (raw - mean) / std)
    assert images.mean(dim=(0, 2, 3)).abs().max() < 1e-3  # the whole cache: zero mean per channel


def test_loader_state_resumes_from_delivered_batches(small_cache):
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, batch_size=4, seed=2)
    full = torch.cat([y for _, y in loader]).tolist()
    batches = iter(loader)
    first = [next(batches)[1] for _ in range(3)]  # the prefetch thread has read further than this
    state = loader.state_dict()
    assert state["consumed"] == 12
    again = make_loader(ds, batch_size=4, seed=2)
    again.load_state_dict(state)
    rest = torch.cat([y for _, y in again]).tolist()
    assert torch.cat(first).tolist() + rest == full


def test_prefetch_thread_propagates_errors(small_cache):
    ds = CachedDataset(small_cache, transform=lambda x: 1 / 0)
    loader = make_loader(ds, batch_size=4, workers=0)
    with pytest.raises(ZeroDivisionError):
        next(iter(loader))


@pytest.fixture(scope="module")
def learnable_cache(tmp_path_factory):
    """Four classes a tiny CNN can tell apart: each tints its images towards one colour."""
    import cv2
    import numpy as np

    from cachekit import BuildConfig, build
    from cachekit.tools.synthetic import synthetic_image

    raw = tmp_path_factory.mktemp("learnable") / "raw"
    rng = np.random.default_rng(0)
    tints = [(1.0, 0.2, 0.2), (0.2, 1.0, 0.2), (0.2, 0.2, 1.0), (0.6, 0.6, 0.6)]
    for c, tint in enumerate(tints):
        (raw / f"c{c}").mkdir(parents=True)
        for i in range(12):
            img = (synthetic_image(rng, 48, 48) * np.array(tint)).astype(np.uint8)
            cv2.imwrite(str(raw / f"c{c}" / f"{i}.png"), img[..., ::-1])
    out = raw.parent / "cache"
    build(raw, out, BuildConfig(size=32, workers=1, progress=False))
    return out


def test_train_ddp_example_under_torchrun(learnable_cache):
    small_cache = learnable_cache
    example = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        "0",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "127.0.0.1:0",
    ]
    proc = subprocess.run(
        [*torchrun, str(example), str(small_cache), "--steps", "40", "--batch-size", "8", "--lr", "0.02"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [line for line in proc.stdout.splitlines() if line.startswith("done:")]
    first, last = (float(v) for v in done[0].split("loss")[1].split("->"))
    assert last < first * 0.9, proc.stdout
