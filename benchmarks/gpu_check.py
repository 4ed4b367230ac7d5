"""One short check of the CUDA paths, for a machine with a GPU (runs the same code on the CPU without one).

    python benchmarks/gpu_check.py [--samples 4096] [--batch-size 256] [--side 256] [--json out.json]

Prints, all measured in this one run:
- augmentation (RandomResizedCrop(224) + flip + ColorJitter) by CPU threads vs on the device
  (``augment_on="threads"`` vs ``"device"``), samples/s, over one synthetic train-256-like cache;
- the side-stream copy: a simulated model step (matmuls) fed by ``make_loader(device=...)`` vs the
  same step with a blocking copy first, i.e. how much of the host-to-device copy is hidden;
- ``autobatch`` for a small ResNet-like model: the batch it picks and the memory it planned with.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from cachekit import CachedDataset, make_loader
from cachekit.tools.autobatch import autobatch
from cachekit.tools.synthetic import write_synthetic_cache
from cachekit.transforms import ColorJitter, RandomHorizontalFlip, RandomResizedCrop


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rate(loader, device: torch.device, step=None) -> float:
    """Samples per second over one pass (after one warm-up pass)."""
    for _ in loader:
        break
    n, t0 = 0, time.perf_counter()
    for images, labels in loader:
        if step is not None:
            step(images)
        n += len(labels)
    _sync(device)
    return n / (time.perf_counter() - t0)


def _step(device: torch.device, work: int):
    """A stand-in model step: ``work`` matmuls of 2048x2048 on the device."""
    a = torch.randn(2048, 2048, device=device)

    def step(images: torch.Tensor) -> None:
        x = a
        for _ in range(work):
            x = x @ a
        images.float().mean()  # the batch is used

    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--side", type=int, default=256, help="stored sample side (train-256 stores 256)")
    ap.add_argument("--work", type=int, default=4, help="matmuls per simulated step")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    figures: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu (no CUDA: the same code paths)"}
    with tempfile.TemporaryDirectory() as tmp:
        cache = write_synthetic_cache(Path(tmp) / "c", args.samples, side=args.side, shard_size=512)
        ds = CachedDataset(cache)
        augment = [RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1)]
        for where in ("threads", "device"):
            loader = make_loader(ds, args.batch_size, device=device, augment=augment, augment_on=where)
            figures[f"augment_on_{where}_samples_per_s"] = _rate(loader, device)
        step = _step(device, args.work)
        overlapped = make_loader(ds, args.batch_size, device=device, dtype=torch.float16)
        figures["side_stream_samples_per_s"] = _rate(overlapped, device, step)
        blocking = make_loader(ds, args.batch_size)  # on the host; copied in the step, blocking

        def step_after_copy(images: torch.Tensor) -> None:
            step(images.to(device).half())

        figures["blocking_copy_samples_per_s"] = _rate(blocking, device, step_after_copy)
        del ds, loader, overlapped, blocking
    model = nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1),
        nn.BatchNorm2d(128),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 1000),
    )
    budget = None if cuda else 2 * 1024**3
    figures["autobatch"] = autobatch(
        model, (3, 224, 224), device=device, max_batch=1024, memory_budget=budget
    )
    for key, value in figures.items():
        print(f"{key}: {value:,.0f}" if isinstance(value, float) else f"{key}: {value}")
    print(
        f"device / threads augmentation: "
        f"{figures['augment_on_device_samples_per_s'] / figures['augment_on_threads_samples_per_s']:.2f}x; "
        f"side stream / blocking copy: "
        f"{figures['side_stream_samples_per_s'] / figures['blocking_copy_samples_per_s']:.2f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
