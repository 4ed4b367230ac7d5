"""One short check of the per-sample pixel stage and MixUp/CutMix on a GPU (the same code on the CPU without one).

    python benchmarks/gpu_photo_check.py [--samples 2048] [--batch-size 256] [--json out.json]

Prints, all from this one run:
- the stage on the device against the CPU rows: every pixel transform (RandAugment, TrivialAugmentWide,
  AutoAugment, grayscale, blur, HSV, erasing) on 64 rows of 224 x 224, levels that differ;
- a DeiT recipe (RandomResizedCrop(224) + flip + RandAugment(2, 9) + RandomErasing(0.25) +
  MixUpOrCutMix) through ``make_loader`` with ``augment_on="threads"`` and ``"device"``: the same
  labels, pixels within a level or so, and samples/s of each;
- detection: RandAugment's geometric ops and Ultralytics' MixUp on the device: the same boxes as the threads.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from cachekit import BuildConfig, build, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.tools.synthetic import synthetic_image, write_synthetic_cache
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import (
    AutoAugment,
    GaussianBlur,
    MixUp,
    MixUpOrCutMix,
    RandAugment,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
    RandomResizedCrop,
    TrivialAugmentWide,
)

EVERY = [
    RandAugment(2, 9),
    TrivialAugmentWide(),
    AutoAugment(),
    RandomGrayscale(0.2),
    GaussianBlur(5),
    RandomHSV(),
    RandomErasing(0.5, value="random"),
]
DEIT = [
    RandomResizedCrop(224),
    RandomHorizontalFlip(),
    RandAugment(2, 9),
    RandomErasing(0.25),
    MixUpOrCutMix(),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def stage_parity(device: torch.device) -> dict:
    plan = compile_plan(EVERY)
    n = 64
    rng = np.random.default_rng(0)
    rows = np.stack([synthetic_image(rng, 224, 224).transpose(2, 0, 1) for _ in range(n)]).copy()
    draws = plan.stage.draw(0, 0, np.arange(n), (224, 224), ((0.48, 0.45, 0.4), (0.23, 0.22, 0.22)))
    cpu = rows.copy()
    for j in range(n):
        draws.apply_row(cpu[j], j)
    got = draws.apply_batch(torch.from_numpy(rows).to(device).float()).cpu().numpy()
    diff = np.abs(got - cpu)
    return {"stage_max_diff": float(diff.max()), "stage_share_over_1": float((diff > 1).mean())}


def _epoch(loader, device) -> tuple[list, float]:
    out, n, t0 = [], 0, time.perf_counter()
    for images, labels in loader:
        out.append((images.cpu(), labels.cpu()))
        n += len(images)
    _sync(device)
    return out, n / (time.perf_counter() - t0)


def deit(cache: Path, device: torch.device, batch: int) -> dict:
    figures = {}
    runs = {}
    for where in ("threads", "device"):
        loader = make_loader(cache, batch, seed=3, augment=DEIT, device=device, augment_on=where)
        _epoch(loader, device)  # warm-up: epoch 0
        runs[where], figures[f"deit_{where}_samples_per_s"] = _epoch(loader, device)  # epoch 1
    labels_equal = all(torch.equal(a[1], b[1]) for a, b in zip(runs["threads"], runs["device"]))
    diff = torch.cat(
        [(a[0].float() - b[0].float()).abs().flatten() for a, b in zip(runs["threads"], runs["device"])]
    )
    figures.update(
        deit_labels_equal=labels_equal,
        deit_mean_diff=float(diff.mean()),
        deit_share_over_2=float((diff > 2).float().mean()),
    )
    return figures


def detection(tmp: Path, device: torch.device) -> dict:
    raw = make_object_dataset(tmp / "objects", 16, size=(120, 160), classes=3)
    cache = tmp / "objects-cache"
    build(
        raw,
        cache,
        BuildConfig(annotations="yolo", masks=str(raw / "masks"), workers=1, progress=False, pipeline="none"),
    )
    augment = [RandomResizedCrop(96), RandAugment(2, 15), MixUp(p=0.5)]
    counts = {}
    for where in ("threads", "device"):
        loader = make_loader(
            cache, 8, seed=5, augment=augment, device=device, augment_on=where, shuffle=False
        )
        counts[where] = [[len(t["boxes"]) for t in targets] for _, targets in loader]
    return {
        "detection_boxes_equal": counts["threads"] == counts["device"],
        "detection_boxes": sum(map(sum, counts["device"])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    figures: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu (no CUDA: the same code paths)"}
    figures.update(stage_parity(device))
    with tempfile.TemporaryDirectory() as tmp:
        cache = write_synthetic_cache(Path(tmp) / "c", args.samples, side=256, shard_size=512)
        figures.update(deit(cache, device, args.batch_size))
        figures.update(detection(Path(tmp), device))
    for key, value in figures.items():
        print(f"{key}: {value:,.4g}" if isinstance(value, float) else f"{key}: {value}")
    print(
        f"DeiT recipe, device / threads: "
        f"{figures['deit_device_samples_per_s'] / figures['deit_threads_samples_per_s']:.2f}x"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
