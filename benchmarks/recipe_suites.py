"""Whole training recipes through make_loader against the same recipe per sample in worker processes.

deit  RandomResizedCrop(224) + flip + RandAugment(2, 9) + RandomErasing(0.25) + MixUp/CutMix from a
      train-256 cache: make_loader on 2 threads against the same recipe written per sample with
      OpenCV and numpy (MixUp/CutMix on the collated batch) in a 2-worker DataLoader over the cache
yolo  Mosaic(640) + RandomAffine + RandomHSV + flip, boxes moved: make_loader on 2 threads against the
      same recipe per sample (Ultralytics' way with OpenCV and numpy: four samples on a 2x canvas,
      one warpAffine, HSV look-up tables, a flip, the box arithmetic) in a 2-worker DataLoader; with
      --ultralytics-python, also against real Ultralytics' YOLODataset with its default training
      augmentation on the same JPEGs (ultralytics_yolo.py, run by that interpreter)

Both need transforms other parts of cachekit provide; while one is missing the suite says which and
is skipped. Each prints samples/s, CPU seconds per wall second and the ratios, per wall second and
per CPU-second (median of per-round ratios, rounds interleaved).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from feed_suites import _cpu_now, _interleaved, _train256
from registry import suite
from torch.utils.data import DataLoader, Dataset

import cachekit.transforms as T
from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.tools.baselines import rrc_params
from cachekit.tools.synthetic_objects import make_object_dataset

__all__ = ["deit", "yolo", "missing_transforms"]


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


# -- DeiT, per sample -----------------------------------------------------------------------------


def _blend(a: np.ndarray, b: np.ndarray, factor: float) -> np.ndarray:
    return np.clip(
        b.astype(np.float32) + factor * (a.astype(np.float32) - b.astype(np.float32)), 0, 255
    ).astype(np.uint8)


def _affine(img: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    h, w = img.shape[:2]
    return cv2.warpAffine(img, matrix, (w, h), flags=cv2.INTER_NEAREST, borderValue=(0, 0, 0))


def _grey(img: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), cv2.COLOR_GRAY2RGB)


def _op(img: np.ndarray, name: str, m: float, rng: np.random.Generator) -> np.ndarray:
    """One of RandAugment's 14 operations at magnitude ``m`` (0-1 of its range), torchvision's ranges."""
    sign = 1 if rng.random() < 0.5 else -1
    h, w = img.shape[:2]
    if name == "Identity":
        return img
    if name == "ShearX":
        return _affine(img, np.float32([[1, sign * 0.3 * m, 0], [0, 1, 0]]))
    if name == "ShearY":
        return _affine(img, np.float32([[1, 0, 0], [sign * 0.3 * m, 1, 0]]))
    if name == "TranslateX":
        return _affine(img, np.float32([[1, 0, sign * 150 / 331 * w * m], [0, 1, 0]]))
    if name == "TranslateY":
        return _affine(img, np.float32([[1, 0, 0], [0, 1, sign * 150 / 331 * h * m]]))
    if name == "Rotate":
        return _affine(img, cv2.getRotationMatrix2D((w / 2, h / 2), sign * 30 * m, 1.0))
    if name == "Brightness":
        return _blend(img, np.zeros_like(img), 1 + sign * 0.9 * m)
    if name == "Color":
        return _blend(img, _grey(img), 1 + sign * 0.9 * m)
    if name == "Contrast":
        mean = np.full_like(img, int(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY).mean() + 0.5))
        return _blend(img, mean, 1 + sign * 0.9 * m)
    if name == "Sharpness":
        smooth = cv2.filter2D(img, -1, np.float32([[1, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13)
        return _blend(img, smooth, 1 + sign * 0.9 * m)
    if name == "Posterize":
        bits = int(8 - round(4 * m))
        return img & np.uint8((0xFF << (8 - bits)) & 0xFF)
    if name == "Solarize":
        threshold = 255 * (1 - m)
        return np.where(img >= threshold, 255 - img, img).astype(np.uint8)
    if name == "AutoContrast":
        lo, hi = img.reshape(-1, 3).min(axis=0), img.reshape(-1, 3).max(axis=0)
        scale = 255.0 / np.maximum(hi - lo, 1)
        return np.clip((img - lo) * scale, 0, 255).astype(np.uint8)
    if name == "Equalize":
        return cv2.merge([cv2.equalizeHist(np.ascontiguousarray(img[:, :, c])) for c in range(3)])
    raise ValueError(name)


_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
        "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")  # fmt: skip


class DeitPerSample:
    """RandomResizedCrop + flip + RandAugment(2, 9) + RandomErasing(0.25) on one ``[C, H, W]`` tensor."""

    def __init__(self, size: int = 224, num_ops: int = 2, magnitude: int = 9, erase: float = 0.25) -> None:
        self.size, self.num_ops, self.m, self.erase = size, num_ops, magnitude / 30, erase

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        rng = np.random.default_rng()
        img = np.ascontiguousarray(image.numpy().transpose(1, 2, 0))
        top, left, h, w = rrc_params(img.shape[0], img.shape[1])
        crop = img[top : top + h, left : left + w]
        shrink = h > self.size or w > self.size
        img = cv2.resize(
            crop, (self.size, self.size), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        )
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = np.ascontiguousarray(img)
        for k in rng.integers(0, len(_OPS), self.num_ops):
            img = _op(img, _OPS[k], self.m, rng)
        if rng.random() < self.erase:  # torchvision's RandomErasing: area 2-33%, log-uniform ratio 0.3-3.3
            for _ in range(10):
                area = self.size * self.size * rng.uniform(0.02, 0.33)
                ratio = math.exp(rng.uniform(math.log(0.3), math.log(3.3)))
                eh, ew = int(round(math.sqrt(area * ratio))), int(round(math.sqrt(area / ratio)))
                if eh < self.size and ew < self.size:
                    y, x = rng.integers(0, self.size - eh + 1), rng.integers(0, self.size - ew + 1)
                    img = img.copy()
                    img[y : y + eh, x : x + ew] = rng.integers(0, 256, (eh, ew, 3), dtype=np.uint8)
                    break
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))


class MixCollate:
    """Stack a batch, then MixUp (alpha 0.8) or CutMix (alpha 1.0), one of the two per batch, soft labels."""

    def __init__(self, classes: int) -> None:
        self.classes = classes

    def __call__(self, batch):
        rng = np.random.default_rng()
        images = torch.stack([b[0] for b in batch])
        labels = torch.nn.functional.one_hot(torch.tensor([b[1] for b in batch]), self.classes).float()
        rolled = images.roll(1, 0)
        if rng.random() < 0.5:
            lam = float(rng.beta(0.8, 0.8))
            images = (images.float() * lam + rolled.float() * (1 - lam)).round().to(torch.uint8)
        else:
            lam = float(rng.beta(1.0, 1.0))
            h, w = images.shape[-2:]
            ch, cw = int(h * math.sqrt(1 - lam)), int(w * math.sqrt(1 - lam))
            cy, cx = rng.integers(0, h), rng.integers(0, w)
            y0, y1, x0, x1 = (
                max(cy - ch // 2, 0),
                min(cy + ch // 2, h),
                max(cx - cw // 2, 0),
                min(cx + cw // 2, w),
            )
            images = images.clone()
            images[:, :, y0:y1, x0:x1] = rolled[:, :, y0:y1, x0:x1]
            lam = 1 - (y1 - y0) * (x1 - x0) / (h * w)
        return images, labels * lam + labels.roll(1, 0) * (1 - lam)


@suite
def deit(args, root):
    missing = missing_transforms("RandAugment", "RandomErasing", "MixUp", "CutMix")
    if missing:
        return _skip("deit", missing)
    cache = _train256(args, root)
    classes = len(CachedDataset(cache).classes)
    recipe = [
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.RandAugment(num_ops=2, magnitude=9),
        T.RandomErasing(0.25),
        T.MixUp(0.8),
        T.CutMix(1.0),
    ]
    per_sample = CachedDataset(cache, transform=DeitPerSample(224))
    theirs = DataLoader(per_sample, args.batch_size, shuffle=True, num_workers=2, persistent_workers=True,
                        collate_fn=MixCollate(classes))  # fmt: skip
    ours = make_loader(cache, args.batch_size, augment=recipe, threads=2)
    rows = _interleaved(
        {
            "make_loader(augment=DeiT recipe), 2 threads": ours,
            "DataLoader(2 workers, the recipe per sample with OpenCV + numpy, MixUp/CutMix in collate)": theirs,
        },
        args.repeats,
    )
    wall, cpu = 1 / rows[1]["ratio_to_first"], _per_cpu(rows)
    print(
        f"make_loader / per-sample recipe in 2 workers: {wall:.2f}x per wall second, {cpu:.2f}x per CPU-second"
    )
    return {"rows": rows, "ratio": wall, "ratio_per_cpu": cpu, "cache": str(cache)}


# -- YOLO, per sample -------------------------------------------------------------------------------


def _hsv(img: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Ultralytics' HSV augmentation: look-up tables of hue, saturation and value gains."""
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
    x = np.arange(0, 256, dtype=np.int16)
    lut_hue = ((x * gains[0]) % 180).astype(np.uint8)
    lut_sat = np.clip(x * gains[1], 0, 255).astype(np.uint8)
    lut_val = np.clip(x * gains[2], 0, 255).astype(np.uint8)
    merged = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    return cv2.cvtColor(merged, cv2.COLOR_HSV2RGB)


class YoloPerSample(Dataset):
    """Mosaic(640) + RandomAffine (translate 0.1, scale 0.5-1.5) + HSV(0.015, 0.7, 0.4) + flip per sample,
    with the boxes, as Ultralytics' dataset does it, reading the cache one sample at a time."""

    def __init__(self, cache: Path, size: int = 640) -> None:
        self.ds, self.size = CachedDataset(cache), size

    def __len__(self) -> int:
        return len(self.ds)

    def _load(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        image, target = self.ds[i]
        img = np.ascontiguousarray(image.numpy().transpose(1, 2, 0))
        h, w = img.shape[:2]
        r = self.size / max(h, w)
        if r != 1:
            img = cv2.resize(img, (round(w * r), round(h * r)), interpolation=cv2.INTER_LINEAR)
        return img, target["boxes"].numpy().astype(np.float32) * r, target["classes"].numpy()

    def __getitem__(self, i: int):
        rng = np.random.default_rng()
        s = self.size
        yc, xc = (int(rng.uniform(s // 2, 3 * s // 2)) for _ in range(2))
        canvas = np.full((2 * s, 2 * s, 3), 114, np.uint8)
        all_boxes, all_classes = [], []
        for k, j in enumerate([i, *rng.integers(0, len(self.ds), 3).tolist()]):
            img, boxes, classes = self._load(j)
            h, w = img.shape[:2]
            if k == 0:
                x1a, y1a, x2a, y2a = max(xc - w, 0), max(yc - h, 0), xc, yc
                x1b, y1b, x2b, y2b = w - (x2a - x1a), h - (y2a - y1a), w, h
            elif k == 1:
                x1a, y1a, x2a, y2a = xc, max(yc - h, 0), min(xc + w, 2 * s), yc
                x1b, y1b, x2b, y2b = 0, h - (y2a - y1a), min(w, x2a - x1a), h
            elif k == 2:
                x1a, y1a, x2a, y2a = max(xc - w, 0), yc, xc, min(2 * s, yc + h)
                x1b, y1b, x2b, y2b = w - (x2a - x1a), 0, w, min(y2a - y1a, h)
            else:
                x1a, y1a, x2a, y2a = xc, yc, min(xc + w, 2 * s), min(2 * s, yc + h)
                x1b, y1b, x2b, y2b = 0, 0, min(w, x2a - x1a), min(y2a - y1a, h)
            canvas[y1a:y2a, x1a:x2a] = img[y1b:y2b, x1b:x2b]
            all_boxes.append(boxes + [x1a - x1b, y1a - y1b, x1a - x1b, y1a - y1b])
            all_classes.append(classes)
        boxes, classes = np.concatenate(all_boxes), np.concatenate(all_classes)
        # random perspective without rotation, shear or perspective: centre, scale, translate
        scale = rng.uniform(0.5, 1.5)
        c = np.eye(3)
        c[0, 2], c[1, 2] = -s, -s  # the 2s canvas centred
        m = np.eye(3)
        m[0, 0] = m[1, 1] = scale
        t = np.eye(3)
        t[0, 2], t[1, 2] = rng.uniform(0.4, 0.6) * s, rng.uniform(0.4, 0.6) * s
        matrix = (t @ m @ c)[:2]
        img = cv2.warpAffine(canvas, matrix, (s, s), borderValue=(114, 114, 114))
        corners = boxes[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 2)
        moved = (np.c_[corners, np.ones(len(corners))] @ matrix.T).reshape(-1, 8)
        xs, ys = moved[:, 0::2], moved[:, 1::2]
        new = np.stack([xs.min(1), ys.min(1), xs.max(1), ys.max(1)], 1).clip(0, s)
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) * scale * scale
        keep = ((new[:, 2] - new[:, 0]) > 2) & ((new[:, 3] - new[:, 1]) > 2)
        keep &= (new[:, 2] - new[:, 0]) * (new[:, 3] - new[:, 1]) > 0.1 * area
        new, classes = new[keep], classes[keep]
        img = _hsv(img, rng.uniform(-1, 1, 3) * [0.015, 0.7, 0.4] + 1)
        if rng.random() < 0.5:
            img = np.ascontiguousarray(img[:, ::-1])
            new = np.stack([s - new[:, 2], new[:, 1], s - new[:, 0], new[:, 3]], 1)
        target = {"boxes": torch.from_numpy(new.astype(np.float32)), "classes": torch.from_numpy(classes)}
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), target


def _collate(batch):
    return torch.stack([b[0] for b in batch]), [b[1] for b in batch]


def _detection_raw(args, root: Path) -> Path:
    """Synthetic 640x480 JPEGs (each side 0.8-1.2x) with YOLO labels and a data.yaml."""
    raw = root / f"objects640-{args.images}"
    if not raw.is_dir():
        make_object_dataset(raw, args.images, size=(480, 640), most=14, ext=".jpg")
    return raw


def _detection_cache(args, root: Path) -> Path:
    raw = _detection_raw(args, root)
    cache = root / f"detect-{raw.name}"
    if not cache.is_dir():  # the longer side at 640, as Ultralytics' load_image and image cache keep them
        build(raw, cache, BuildConfig(annotations="yolo", pipeline="max-side-512", size=640, progress=False))
    return cache


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
    recipe = [
        T.Mosaic(640),
        T.RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5)),
        T.RandomHSV(h=0.015, s=0.7, v=0.4),
        T.RandomHorizontalFlip(),
    ]
    theirs = DataLoader(YoloPerSample(cache, 640), args.batch_size, shuffle=True, num_workers=2,
                        persistent_workers=True, collate_fn=_collate)  # fmt: skip
    ours = make_loader(cache, args.batch_size, augment=recipe, threads=2)
    rows = _interleaved(
        {
            "make_loader(augment=[Mosaic, RandomAffine, RandomHSV, flip]), boxes moved, 2 threads": ours,
            "DataLoader(2 workers, Ultralytics-style mosaic + warpAffine + HSV + flip per sample)": theirs,
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
