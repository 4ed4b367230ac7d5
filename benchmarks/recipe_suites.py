"""Whole training recipes through make_loader against the same recipe per sample in worker processes.

deit  RandomResizedCrop(224) + flip + RandAugment(2, 9) + RandomErasing(0.25) + MixUp/CutMix from a
      train-256 cache: make_loader on 2 threads against the same recipe written per sample the
      fastest way a user could (recipe_baselines.py: channels-last OpenCV, LUTs and addWeighted;
      MixUp/CutMix on the collated batch) in a 2-worker DataLoader over the cache
yolo  Mosaic(640) + RandomAffine + RandomHSV + flip, boxes moved, fill 114 on both sides: make_loader
      on 2 threads against the same recipe per sample (Ultralytics' way, channels-last: four samples
      on a 2x canvas, one warpAffine with the flip folded in, one HSV look-up table, the box
      arithmetic) in a 2-worker DataLoader; with --ultralytics-python, also against real
      Ultralytics' YOLODataset with its default training augmentation on the same JPEGs
      (ultralytics_yolo.py, run by that interpreter)

(floors and parent, the recipes against their bare kernels and against another checkout:
recipe_floors.py)

Both need transforms other parts of cachekit provide; while one is missing the suite says which and
is skipped. Each prints samples/s, CPU seconds per wall second and the ratios, per wall second and
per CPU-second (median of per-round ratios, rounds interleaved).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from feed_suites import _cpu_now, _interleaved, _train256
from recipe_baselines import DeitPerSample, MixCollate, YoloPerSample, yolo_collate
from recipe_runner import build_cache, recipe
from registry import suite
from torch.utils.data import DataLoader

import cachekit.transforms as T
from cachekit import CachedDataset, make_loader
from cachekit.tools.synthetic_objects import make_object_dataset

__all__ = ["deit", "yolo", "missing_transforms", "deit_recipe", "yolo_recipe"]


def deit_recipe() -> list:
    """DeiT's training augmentation, as cachekit's transforms."""
    return recipe("deit")


def yolo_recipe() -> list:
    """Ultralytics' default training augmentation (no MixUp), as cachekit's transforms, fill 114."""
    return recipe("yolo")


def missing_transforms(*names: str) -> list[str]:
    """The transforms of ``names`` that ``cachekit.transforms`` does not have."""
    return [n for n in names if not hasattr(T, n)]


def _skip(suite_name: str, missing: list[str]) -> dict:
    print(f"{suite_name}: skipped: needs transform(s) {', '.join(missing)} in cachekit.transforms")
    return {"skipped": True, "missing": missing}


def _per_cpu(rows: list[dict]) -> float:
    """Samples per CPU-second of the first row (ours) over the second's (theirs)."""
    ours, theirs = rows[0], rows[1]
    return (ours["samples_per_s"] / ours["cpu_per_wall"]) / (theirs["samples_per_s"] / theirs["cpu_per_wall"])


@suite
def deit(args, root):
    missing = missing_transforms("RandAugment", "RandomErasing", "MixUp", "CutMix")
    if missing:
        return _skip("deit", missing)
    cache = _train256(args, root)
    classes = len(CachedDataset(cache).classes)
    recipe = deit_recipe()
    per_sample = CachedDataset(cache, transform=DeitPerSample(224))
    theirs = DataLoader(per_sample, args.batch_size, shuffle=True, num_workers=2, persistent_workers=True,
                        collate_fn=MixCollate(classes))  # fmt: skip
    ours = make_loader(cache, args.batch_size, augment=recipe, threads=2)
    rows = _interleaved(
        {
            "make_loader(augment=DeiT recipe), 2 threads": ours,
            "DataLoader(2 workers, the recipe per sample, OpenCV LUTs + addWeighted channels-last, "
            "MixUp/CutMix in collate)": theirs,
        },
        args.repeats,
    )
    wall, cpu = 1 / rows[1]["ratio_to_first"], _per_cpu(rows)
    print(
        f"make_loader / per-sample recipe in 2 workers: {wall:.2f}x per wall second, {cpu:.2f}x per CPU-second"
    )
    return {"rows": rows, "ratio": wall, "ratio_per_cpu": cpu, "cache": str(cache)}


# -- YOLO -------------------------------------------------------------------------------------------


def _detection_raw(args, root: Path) -> Path:
    """Synthetic 640x480 JPEGs (each side 0.8-1.2x) with YOLO labels and a data.yaml."""
    raw = root / f"objects640-{args.images}"
    if not raw.is_dir():
        make_object_dataset(raw, args.images, size=(480, 640), most=14, ext=".jpg")
    return raw


def _detection_cache(args, root: Path) -> Path:
    raw = _detection_raw(args, root)
    return build_cache("det", raw, root / f"detect-{raw.name}")


def _images_pass(loader) -> tuple[float, float]:
    """One timed pass counting images (batch[1] of collate="yolo" is the rows of boxes): (samples/s,
    CPU seconds per wall second)."""
    t0, c0, n = time.perf_counter(), _cpu_now(), 0
    for batch in loader:
        n += len(batch[0])
    wall = time.perf_counter() - t0
    return n / wall, (_cpu_now() - c0) / wall


def _ultralytics(args, root: Path, recipe: list) -> dict:
    """make_loader (collate="yolo") against Ultralytics' YOLODataset in 2 workers, per CPU-second.

    Each round times one pass of make_loader, then runs the Ultralytics runner once with its image
    cache off (it decodes the JPEGs every time, its default) and once with ``cache="ram"`` (decoded
    and resized once, like the cache); each runner does a warm-up epoch and one timed epoch. Ratios
    are medians of the per-round ratios.
    """
    raw, cache = _detection_raw(args, root), _detection_cache(args, root)
    script = Path(__file__).with_name("ultralytics_yolo.py")
    env = {**os.environ, "YOLO_CONFIG_DIR": str(root / "ultralytics-settings"), "YOLO_OFFLINE": "1"}
    ours = make_loader(cache, args.batch_size, augment=recipe, threads=2, collate="yolo")
    for _ in ours:  # warm-up
        pass
    ours_runs: list[tuple[float, float]] = []
    theirs_runs: dict[str, list[tuple[float, float]]] = {"none": [], "ram": []}
    info: dict = {}
    for _ in range(args.repeats):
        ours_runs.append(_images_pass(ours))
        for mode, runs in theirs_runs.items():
            cmd = [args.ultralytics_python, str(script), str(raw), "--batch-size", str(args.batch_size)]
            cmd += ["--epochs", "1", "--workers", "2", "--cache", mode]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if done.returncode:  # e.g. that interpreter has no ultralytics: say so and go on
                tail = " / ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
                print(
                    f"ultralytics: skipped: {args.ultralytics_python} {script.name} --cache {mode} failed: {tail}"
                )
                return {"skipped": True, "error": tail}
            info = json.loads(done.stdout.strip().splitlines()[-1])
            runs.append((info["samples_per_s"][0], info["cpu_per_wall"][0]))

    def row(name: str, passes: list[tuple[float, float]]) -> dict:
        out = {
            "loader": name,
            "samples_per_s": statistics.median(r for r, _ in passes),
            "cpu_per_wall": statistics.median(c for _, c in passes),
            "samples_per_cpu_s": statistics.median(r / c for r, c in passes),
        }
        print(
            f"{name}: {out['samples_per_s']:,.1f} samples/s, {out['cpu_per_wall']:.2f} CPU s per wall s, "
            f"{out['samples_per_cpu_s']:,.1f} samples per CPU-second"
        )
        return out

    rows = [row("make_loader(augment=YOLO recipe, collate='yolo'), 2 threads, cache max-side 640", ours_runs)]
    result: dict = {"rows": rows, "raw": str(raw), "cache": str(cache)}
    for mode, runs in theirs_runs.items():
        rows.append(row(f"Ultralytics YOLODataset (default augmentation, cache={mode}), 2 workers", runs))
        wall = statistics.median(o[0] / t[0] for o, t in zip(ours_runs, runs))
        cpu = statistics.median((o[0] / o[1]) / (t[0] / t[1]) for o, t in zip(ours_runs, runs))
        print(
            f"make_loader / Ultralytics (cache={mode}): {wall:.2f}x per wall second, {cpu:.2f}x per CPU-second"
        )
        result[f"ratio_{mode}"], result[f"ratio_per_cpu_{mode}"] = wall, cpu
    result["ultralytics"] = {k: info.get(k) for k in ("ultralytics", "torch", "python", "transforms", "hyp")}
    print(f"Ultralytics {info.get('ultralytics')}, torch {info.get('torch')}: {info.get('transforms')}")
    return result


@suite
def yolo(args, root):
    missing = missing_transforms("Mosaic", "RandomAffine", "RandomHSV")
    if missing:
        return _skip("yolo", missing)
    cache = _detection_cache(args, root)
    recipe = yolo_recipe()
    theirs = DataLoader(YoloPerSample(cache, 640), args.batch_size, shuffle=True, num_workers=2,
                        persistent_workers=True, collate_fn=yolo_collate)  # fmt: skip
    ours = make_loader(cache, args.batch_size, augment=recipe, threads=2)
    rows = _interleaved(
        {
            "make_loader(augment=[Mosaic, RandomAffine, RandomHSV, flip]), boxes moved, 2 threads": ours,
            "DataLoader(2 workers, Ultralytics-style mosaic + warpAffine (flip folded) + HSV LUT per sample, "
            "channels-last)": theirs,
        },
        args.repeats,
    )
    wall, cpu = 1 / rows[1]["ratio_to_first"], _per_cpu(rows)
    print(
        f"make_loader / per-sample recipe in 2 workers: {wall:.2f}x per wall second, {cpu:.2f}x per CPU-second"
    )
    out = {"rows": rows, "ratio": wall, "ratio_per_cpu": cpu, "cache": str(cache)}
    if args.ultralytics_python:
        out["ultralytics"] = _ultralytics(args, root, recipe)
    return out
