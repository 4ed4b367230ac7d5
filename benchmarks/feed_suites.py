"""Read-path suites: augmentation at read time, encoded stores in-process, class mix, FFCV side by side.

feed    RandomResizedCrop(224) + flip from a train-256 pixel cache: make_loader(augment=...) in this
        process vs a per-sample OpenCV transform in a plain 2-worker DataLoader; samples/s and CPU use
jpeg    a --store jpeg cache: decoded by threads in the training process vs worker processes
ffcv    FFCV 1.0.2's RandomResizedCropRGBImageDecoder + flip on the same images (needs --ffcv-python)
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from registry import suite, synthetic_raw
from torch.utils.data import DataLoader

from cachekit import BuildConfig, CachedDataset, build, collate_batch, make_loader
from cachekit.tools.doctor import _cpu_seconds, child_pids
from cachekit.transforms import ColorJitter, RandomHorizontalFlip, RandomResizedCrop

__all__ = ["OpenCVRandomResizedCropFlip"]


class OpenCVRandomResizedCropFlip:
    """What a user writes as a per-sample ``transform=``: torchvision's RandomResizedCrop parameters,
    one OpenCV resize, a random flip (a worker's own ``random`` state)."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, chw: torch.Tensor) -> torch.Tensor:
        img = chw.numpy().transpose(1, 2, 0)
        height, width = img.shape[:2]
        area = height * width
        for _ in range(10):
            target = area * random.uniform(*self.scale)
            aspect = np.exp(random.uniform(np.log(self.ratio[0]), np.log(self.ratio[1])))
            w, h = int(round(np.sqrt(target * aspect))), int(round(np.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top, left = random.randint(0, height - h), random.randint(0, width - w)
                break
        else:
            top, left, h, w = 0, 0, height, width
        crop = np.ascontiguousarray(img[top : top + h, left : left + w])
        out = cv2.resize(crop, (self.size, self.size), interpolation=cv2.INTER_LINEAR)
        if random.random() < 0.5:
            out = out[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))


def _cpu_now() -> float:
    """CPU seconds of this process (all its threads) and of its live children (worker processes)."""
    return time.process_time() + sum(_cpu_seconds(pid) for pid in child_pids())


def _time(name: str, loader, epochs: int) -> dict:
    """Warm-up pass, then ``epochs`` timed passes: median samples/s and CPU seconds per wall second."""
    for _ in loader:
        pass
    rates, cpu_share = [], []
    for _ in range(epochs):
        t0, c0, n = time.perf_counter(), _cpu_now(), 0
        for batch in loader:
            n += len(batch[1])
        wall = time.perf_counter() - t0
        rates.append(n / wall)
        cpu_share.append((_cpu_now() - c0) / wall)
    row = {
        "loader": name,
        "samples_per_s": statistics.median(rates),
        "cpu_per_wall": statistics.median(cpu_share),
    }
    print(f"{name}: {row['samples_per_s']:,.0f} samples/s, {row['cpu_per_wall']:.2f} CPU s per wall s")
    return row


def _train256(args, root: Path) -> Path:
    raw = synthetic_raw(args, root)
    cache = root / f"train256-{raw.name}"
    if not cache.is_dir():
        build(raw, cache, BuildConfig(pipeline="train-256", progress=False))
    return cache


@suite
def feed(args, root):
    cache = _train256(args, root)
    ds = CachedDataset(cache)
    bs = args.batch_size
    ours = _time(
        "make_loader(augment=[RandomResizedCrop(224), RandomHorizontalFlip()])",
        make_loader(ds, bs, augment=[RandomResizedCrop(224), RandomHorizontalFlip()]),
        args.repeats,
    )
    jitter = _time(
        "  + ColorJitter(0.4, 0.4, 0.4, 0.1)",
        make_loader(
            ds, bs, augment=[RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1)]
        ),
        args.repeats,
    )
    per_sample = CachedDataset(cache, transform=OpenCVRandomResizedCropFlip(224))
    plain = DataLoader(
        per_sample, bs, shuffle=True, num_workers=2, persistent_workers=True, collate_fn=collate_batch
    )
    baseline = _time(
        "DataLoader(2 workers, transform=OpenCV RandomResizedCrop + flip per sample)", plain, args.repeats
    )
    ratio = ours["samples_per_s"] / baseline["samples_per_s"]
    print(f"make_loader augment / per-sample transform in 2 workers: {ratio:.2f}x")
    return {"rows": [ours, jitter, baseline], "ratio": ratio, "cache": str(cache), "samples": len(ds)}


@suite
def jpeg(args, root):
    raw = synthetic_raw(args, root)
    cache = root / f"jpeg-{raw.name}"
    if not cache.is_dir():
        build(raw, cache, BuildConfig(store="jpeg", progress=False))
    ds = CachedDataset(cache)
    threads = _time(
        "make_loader defaults (threads decode in this process)",
        make_loader(ds, args.batch_size),
        args.repeats,
    )
    workers = _time(
        "make_loader(workers=2) (worker processes)", make_loader(ds, args.batch_size, workers=2), args.repeats
    )
    ratio = threads["samples_per_s"] / workers["samples_per_s"]
    print(f"in-process threads / worker processes: {ratio:.2f}x")
    return {"rows": [threads, workers], "ratio": ratio}


@suite
def ffcv(args, root):
    """FFCV on the very images of the train-256 cache, run by another interpreter that has ffcv."""
    if not args.ffcv_python:
        print("skipped: pass --ffcv-python /path/to/venv/bin/python (a venv with ffcv 1.0.2; see README)")
        return {"skipped": True}
    cache = _train256(args, root)
    ds = CachedDataset(cache)
    beton = root / f"ffcv-{cache.name}.beton"
    script = Path(__file__).with_name("ffcv_rrc.py")
    cmd = [args.ffcv_python, str(script), str(cache), str(beton), "--batch-size", str(args.batch_size)]
    cmd += ["--epochs", str(args.repeats), "--threads", "2"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    theirs = float(out.strip().splitlines()[-1].split()[0])
    ours = _time(
        "make_loader(augment=[RandomResizedCrop(224), RandomHorizontalFlip()]), 2 threads",
        make_loader(ds, args.batch_size, augment=[RandomResizedCrop(224), RandomHorizontalFlip()], threads=2),
        args.repeats,
    )
    ratio = ours["samples_per_s"] / theirs
    print(f"FFCV RandomResizedCropRGBImageDecoder + RandomHorizontalFlip, 2 threads: {theirs:,.0f} samples/s")
    print(f"cachekit / FFCV: {ratio:.2f}x")
    return {"ffcv_samples_per_s": theirs, "ours": ours, "ratio": ratio, "python": sys.version}
