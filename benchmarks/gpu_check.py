"""One short check of the CUDA paths, for a machine with a GPU (runs the same code on the CPU without one).

    python benchmarks/gpu_check.py [--samples 4096] [--batch-size 256] [--side 256] [--json out.json]

Prints, all measured in this one run:
- augmentation (RandomResizedCrop(224) + flip + ColorJitter) by CPU threads vs on the device
  (``augment_on="threads"`` vs ``"device"``), samples/s, over one synthetic train-256-like cache;
- the side-stream copy: a simulated model step (matmuls) fed by ``make_loader(device=...)`` vs the
  same step with a blocking copy first, i.e. how much of the host-to-device copy is hidden;
- ``autobatch`` for a small ResNet-like model: the batch it picks and the memory it planned with;
- one map per sample on the device (``grid_sample``) against the threads (``cv2.warpAffine``): an
  affine + perspective list on the classification cache (levels that differ, samples/s of each), and
  a YOLO recipe (Mosaic + RandomAffine + RandomHSV + flip) on a detection cache (the same boxes,
  samples/s of each). ``benchmarks/gpu_photo_check.py`` checks the per-sample pixel stage and
  MixUp/CutMix the same way.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.tools.autobatch import autobatch
from cachekit.tools.synthetic import write_synthetic_cache
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import (
    ColorJitter,
    Mosaic,
    RandomAffine,
    RandomHorizontalFlip,
    RandomHSV,
    RandomPerspective,
    RandomResizedCrop,
)


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


def _pass(loader, device: torch.device) -> tuple[list, float]:
    """One epoch's batches (on the host) and its samples/s, after a warm-up epoch."""
    for _ in loader:
        pass
    out, n, t0 = [], 0, time.perf_counter()
    for images, targets in loader:
        out.append((images.float().cpu(), targets))
        n += len(images)
    _sync(device)
    return out, n / (time.perf_counter() - t0)


def geometry(tmp: Path, cache: Path, device: torch.device, batch: int, objects: int) -> dict:
    """One map per sample: the device's grid_sample against the threads' warps, pixels and boxes."""
    figures = {}
    warp = [RandomResizedCrop(224), RandomAffine(20, (0.1, 0.1), (0.7, 1.3), 10), RandomPerspective(0.3)]
    runs = {}
    for where in ("threads", "device"):
        loader = make_loader(cache, batch, seed=3, augment=warp, device=device, augment_on=where)
        runs[where], figures[f"affine_{where}_samples_per_s"] = _pass(loader, device)
    diff = torch.cat([(a[0] - b[0]).abs().flatten() for a, b in zip(runs["threads"], runs["device"])])
    figures["affine_mean_level_diff"] = float(diff.mean())
    figures["affine_share_over_8_levels"] = float((diff > 8).float().mean())
    raw = make_object_dataset(tmp / "objects", objects, size=(480, 640), classes=3, ext=".jpg")
    det = tmp / "objects-cache"
    build(raw, det, BuildConfig(annotations="yolo", workers=2, progress=False, pipeline="none"))
    yolo = [
        Mosaic(640),
        RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5)),
        RandomHSV(h=0.015, s=0.7, v=0.4),
        RandomHorizontalFlip(),
    ]
    boxes = {}
    for where in ("threads", "device"):
        loader = make_loader(det, 16, seed=5, augment=yolo, device=device, augment_on=where, collate="yolo")
        out, figures[f"yolo_{where}_samples_per_s"] = _pass(loader, device)
        boxes[where] = [t.cpu() for _, t in out]
    figures["yolo_boxes_equal"] = all(
        a.shape == b.shape and torch.allclose(a, b, atol=1e-4)
        for a, b in zip(boxes["threads"], boxes["device"])
    )
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--side", type=int, default=256, help="stored sample side (train-256 stores 256)")
    ap.add_argument("--work", type=int, default=4, help="matmuls per simulated step")
    ap.add_argument("--objects", type=int, default=256, help="images of the detection cache (YOLO recipe)")
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
        figures.update(geometry(Path(tmp), cache, device, args.batch_size, args.objects))
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
        shown = (
            (f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4f}") if isinstance(value, float) else value
        )
        print(f"{key}: {shown}")
    print(
        f"device / threads augmentation: "
        f"{figures['augment_on_device_samples_per_s'] / figures['augment_on_threads_samples_per_s']:.2f}x; "
        f"side stream / blocking copy: "
        f"{figures['side_stream_samples_per_s'] / figures['blocking_copy_samples_per_s']:.2f}x; "
        f"affine + perspective device / threads: "
        f"{figures['affine_device_samples_per_s'] / figures['affine_threads_samples_per_s']:.2f}x; "
        f"YOLO recipe device / threads: "
        f"{figures['yolo_device_samples_per_s'] / figures['yolo_threads_samples_per_s']:.2f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
