"""The default store against ``--store pixels-hwc``, as planes and as ``channels_last=True`` batches,
per recipe, per CPU-second; and the YOLO recipe against its exact floor.

    python benchmarks/store_layouts.py                                  # this checkout
    python benchmarks/store_layouts.py --against /tmp/parent            # and another checkout's code

Two small caches are built from code (synthetic photo-like images) in both stores: ``cls``, ~300
images of 256 px on their shorter side (``train-256``), read with RandomResizedCrop(224) + flip,
README's DeiT recipe (normalised, MixUp/CutMix) and CenterCrop(224) (evaluation's read); ``det``, ~300 images of about 640 x 480 with boxes
(their longer side at 640, as Ultralytics loads them), read with README's YOLO recipe
(``collate="yolo"``). Each loader (recipe x store x ``channels_last`` x 1 or 2 threads) lives in a
child process per checkout (``--against``: the other code on ``PYTHONPATH``), and rounds of one pass
of each loader are interleaved across loaders and checkouts, so a slow spell of a shared machine
falls on all of them. A pass's cost is its child's CPU seconds (every thread of it) per sample;
each figure is the median over rounds of its ratio to the default store's (or to this checkout's)
in the same round: compare ratios, never samples/s across runs.

``floor``: the YOLO recipe's OpenCV calls for a sample in one loop with nothing around them (its
canvas's window filled and its four tiles resized and pasted, channels-last; one warpAffine; RGB to
HSV, a look-up table per channel (split, three tables, merge: faster than OpenCV's one
three-channel table here), HSV to RGB; the split into the batch's planes), at the same
sizes and draws as the loader's, on one thread; ``make_loader / floor`` is samples per CPU-second
of the loader on one thread over the floor's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
STORES = {"planes": ("pixels", False), "hwc": ("pixels-hwc", False), "hwc-cl": ("pixels-hwc", True),
          "cl": ("pixels", True)}  # fmt: skip
RECIPES = ("RRC-flip", "DeiT", "YOLO", "CenterCrop")


# --- the caches (built once, by this checkout) ----------------------------------------------------


def _cls_samples(n: int):
    from cachekit.tools.synthetic import synthetic_image

    for i in range(n):
        rng = np.random.default_rng([21, i])
        h, w = int(rng.integers(256, 340)), int(rng.integers(300, 420))
        yield synthetic_image(rng, h, w), i % 10


def _det_samples(n: int):
    from cachekit.tools.synthetic import synthetic_image

    for i in range(n):
        rng = np.random.default_rng([22, i])
        h, w = int(480 * rng.uniform(0.8, 1.2)), int(640 * rng.uniform(0.8, 1.2))
        image = synthetic_image(rng, h, w)
        boxes = []
        for _ in range(int(rng.integers(1, 8))):
            bw, bh = int(rng.integers(16, w // 3)), int(rng.integers(16, h // 3))
            x, y = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
            boxes.append([x, y, x + bw, y + bh])
        classes = rng.integers(0, 3, len(boxes))
        yield image, {"boxes": np.array(boxes, np.float32), "classes": classes.astype(np.int64)}


def build_caches(root: Path, images: int) -> dict[str, str]:
    """``{"<cls|det>-<store>": path}``, built where missing."""
    from cachekit import BuildConfig, build

    paths = {}
    for kind, samples, pipeline, size in (("cls", _cls_samples, "train-256", 256),
                                          ("det", _det_samples, "max-side-512", 640)):  # fmt: skip
        for store in ("pixels", "pixels-hwc"):
            path = root / f"{kind}-{store}-{images}"
            if not (path / "manifest.json").exists():
                options = {"classes": [f"c{c}" for c in range(10 if kind == "cls" else 3)]}
                build(samples(images), path, BuildConfig(pipeline=pipeline, size=size, store=store, progress=False),
                      **options)  # fmt: skip
            paths[f"{kind}-{store}"] = str(path)
    return paths


# --- a child: one checkout's loaders, a pass at a time --------------------------------------------


def _recipe(name: str):
    import cachekit.transforms as T

    if name == "CenterCrop":  # evaluation's read: torchvision's Resize(256) + CenterCrop(224), stored
        return "cls", [T.CenterCrop(224)], {}
    if name == "RRC-flip":
        return "cls", [T.RandomResizedCrop(224), T.RandomHorizontalFlip()], {}
    if name == "DeiT":
        steps = [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.RandAugment(num_ops=2, magnitude=9),
                 T.RandomErasing(0.25), T.MixUp(0.8), T.CutMix(1.0)]  # fmt: skip
        return "cls", steps, {"normalize": True}
    if name != "YOLO":
        raise SystemExit(f"unknown recipe {name!r}: one of {', '.join(RECIPES)}")
    tail = [T.RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5), fill=114),
            T.RandomHSV(h=0.015, s=0.7, v=0.4), T.RandomHorizontalFlip()]  # fmt: skip
    return "det", [T.Mosaic(640), *tail], {"collate": "yolo"}


def _loader(key: str, caches: dict, batch: int):
    from cachekit import make_loader

    recipe, layout, threads = key.split("/")
    kind, steps, options = _recipe(recipe)
    store, last = STORES[layout]
    return make_loader(caches[f"{kind}-{store}"], batch, seed=3, augment=steps, threads=int(threads),
                       channels_last=last, **options)  # fmt: skip


def _timed(fn) -> tuple[int, float]:
    c0 = time.process_time()
    n = fn()
    return n, time.process_time() - c0


_FLOOR: dict = {}


def floor_yolo(caches: dict, samples: int, seed: int = 0, lut3: bool = False) -> int:
    """The YOLO recipe's OpenCV calls for ``samples`` samples of the ``det`` cache, in one loop, into
    buffers made once (``lut3``: one three-channel table instead of a split, three tables, a merge)."""
    import cv2

    from cachekit import CachedDataset

    if "images" not in _FLOOR:  # read once, outside the timing
        ds = CachedDataset(caches["det-pixels-hwc"])
        _FLOOR["images"] = [np.ascontiguousarray(ds[i][0].numpy().transpose(1, 2, 0))
                            for i in range(min(len(ds), 64))]  # fmt: skip
    images = _FLOOR["images"]
    s, c = 640, 1280
    rng = np.random.default_rng(seed)
    canvas = np.empty((c, c, 3), np.uint8)
    warped, hsv = np.empty((s, s, 3), np.uint8), np.empty((s, s, 3), np.uint8)
    planes = [np.empty((s, s), np.uint8) for _ in range(3)]
    row = np.empty((3, s, s), np.uint8)
    x = np.arange(256, dtype=np.float64)
    for _ in range(samples):
        xc, yc = (int(v) for v in rng.uniform(s / 2, 3 * s / 2, 2))
        angle_scale = rng.uniform(0.5, 1.5)
        tx, ty = rng.uniform(0.4, 0.6, 2) * s
        flip = rng.random() < 0.5
        # the canvas's centre at the output's, scaled, shifted, mirrored; the window it reads
        m = np.array([[angle_scale, 0, tx - angle_scale * s], [0, angle_scale, ty - angle_scale * s], [0, 0, 1.0]])
        if flip:
            m = np.array([[-1, 0, s], [0, 1, 0], [0, 0, 1.0]]) @ m
        inv = np.linalg.inv(m)
        corners = inv @ np.array([[0, s, 0, s], [0, 0, s, s], [1, 1, 1, 1]], np.float64)
        x0, y0 = (max(int(np.floor(corners[k].min())) - 2, 0) for k in (0, 1))
        x1, y1 = (min(int(np.ceil(corners[k].max())) + 2, c) for k in (0, 1))
        x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)
        window = canvas[y0:y1, x0:x1]
        window[...] = 114
        tiles = [images[int(v)] for v in rng.integers(0, len(images), 4)]
        for k, img in enumerate(tiles):
            h, w = img.shape[:2]
            r = s / max(h, w)
            nh, nw = min(int(np.ceil(h * r)), s), min(int(np.ceil(w * r)), s)
            left = xc - nw if k in (0, 2) else xc
            top = yc - nh if k in (0, 1) else yc
            a0, b0, a1, b1 = max(left, x0, 0), max(top, y0, 0), min(left + nw, x1, c), min(top + nh, y1, c)
            if a1 <= a0 or b1 <= b0:
                continue
            resized = img if (nh, nw) == (h, w) else cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
            window[b0 - y0 : b1 - y0, a0 - x0 : a1 - x0] = resized[b0 - top : b1 - top, a0 - left : a1 - left]
        shift = np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1.0]])
        cv2.warpAffine(window, np.linalg.inv(m @ shift)[:2], (s, s), dst=warped,
                       flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP, borderValue=(114, 114, 114))  # fmt: skip
        gains = rng.uniform(-1, 1, 3) * (0.015, 0.7, 0.4)
        tables = [((x + gains[0] * 180) % 180).astype(np.uint8), np.clip(x * (gains[1] + 1), 0, 255).astype(np.uint8),
                  np.clip(x * (gains[2] + 1), 0, 255).astype(np.uint8)]  # fmt: skip
        cv2.cvtColor(warped, cv2.COLOR_RGB2HSV, dst=hsv)
        if lut3:  # one three-channel table
            cv2.LUT(hsv, np.stack(tables, axis=1).reshape(256, 1, 3), dst=hsv)
        else:  # a table per plane (the faster, here)
            cv2.split(hsv, planes)
            for plane, table in zip(planes, tables):
                cv2.LUT(plane, table, dst=plane)
            cv2.merge(planes, hsv)
        cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB, dst=warped)
        cv2.split(warped, [row[0], row[1], row[2]])
    return samples


def child(caches: dict, batch: int) -> None:
    """Reads keys (``recipe/layout/threads``, or ``floor/<samples>``) from stdin, one a line; answers
    each with one pass's ``{"samples": n, "cpu": s}`` (the first call of a key is a warm-up pass)."""
    import cv2
    import torch

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    loaders: dict = {}
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        if key.startswith("floor/"):
            samples = int(key.split("/")[1])
            n, cpu = _timed(lambda: floor_yolo(caches, samples))  # noqa: B023 - called at once
        else:
            if key not in loaders:
                loaders[key] = _loader(key, caches, batch)
                for _ in loaders[key]:
                    pass
            loader = loaders[key]
            n, cpu = _timed(lambda: sum(len(b[0]) for b in loader))  # noqa: B023 - called at once
        print(json.dumps({"samples": n, "cpu": cpu}), flush=True)


# --- the run: children, interleaved rounds -------------------------------------------------------


def _spawn(code: Path, caches: dict, batch: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(code)}
    return subprocess.Popen([sys.executable, str(HERE), "--child", json.dumps(caches), "--batch", str(batch)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd="/")  # fmt: skip


def _ask(proc: subprocess.Popen, key: str) -> float:
    """Samples per CPU-second of one pass of ``key`` in ``proc``."""
    proc.stdin.write(key + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the child running {key} stopped (see its error above)")
    got = json.loads(line)
    return got["samples"] / max(got["cpu"], 1e-9)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/tmp/cachekit-store-layouts", help="where the caches are built")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--layouts", default=",".join(STORES))
    parser.add_argument("--against", metavar="CHECKOUT", help="another checkout's code, measured beside this one")
    parser.add_argument("--floor", type=int, default=96, help="samples of the YOLO floor a round (0: none)")
    parser.add_argument("--json", metavar="FILE", help="also save the figures")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child), args.batch)
        return 0
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    caches = build_caches(root, args.images)
    codes = {"this": ROOT} | ({"against": Path(args.against).resolve()} if args.against else {})
    procs = {name: _spawn(code, caches, args.batch) for name, code in codes.items()}
    for name in args.recipes.split(","):  # before any child starts, so a typo is not a YOLO run
        if name not in RECIPES:
            parser.error(f"unknown recipe {name!r}: one of {', '.join(RECIPES)}")
    keys = [f"{r}/{layout}/{t}" for r in args.recipes.split(",") for t in args.threads.split(",")
            for layout in args.layouts.split(",")]  # fmt: skip
    rates: dict[tuple[str, str], list[float]] = {}
    try:
        for round_ in range(args.rounds + 1):  # round 0: warm-up passes, not kept
            for key in keys:
                for name, proc in (procs.items() if round_ % 2 else reversed(procs.items())):
                    rate = _ask(proc, key)
                    if round_:
                        rates.setdefault((name, key), []).append(rate)
            if args.floor and "YOLO" in args.recipes.split(","):
                rate = _ask(procs["this"], f"floor/{args.floor}")
                if round_:
                    rates.setdefault(("this", "floor"), []).append(rate)
            if round_:
                print(f"round {round_} of {args.rounds} done", file=sys.stderr)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    report = _report(rates, keys, list(codes), args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def _report(rates: dict, keys: list[str], codes: list[str], args) -> dict:
    out: dict = {"samples_per_cpu_s": {f"{n}:{k}": statistics.median(v) for (n, k), v in rates.items()}}
    print(f"samples per CPU-second (median of {args.rounds} rounds), and ratios in the same rounds")
    header = f"{'recipe/layout/threads':28s} {'this':>8s} {'/planes':>8s}"
    if "against" in codes:
        header += f" {'against':>8s} {'this/against':>13s}"
    print(header)
    for key in keys:
        recipe, layout, threads = key.split("/")
        base = ("this", f"{recipe}/planes/{threads}")
        mine = rates[("this", key)]
        line = f"{key:28s} {statistics.median(mine):8.0f}"
        line += f" {_median_ratio(mine, rates[base]):8.2f}" if base in rates else f" {'':8s}"
        out.setdefault("vs_planes", {})[key] = _median_ratio(mine, rates[base]) if base in rates else None
        if "against" in codes:
            theirs = rates[("against", key)]
            ratio = _median_ratio(mine, theirs)
            line += f" {statistics.median(theirs):8.0f} {ratio:13.2f}"
            out.setdefault("vs_against", {})[key] = ratio
        print(line)
    if ("this", "floor") in rates:
        floor = rates[("this", "floor")]
        print(f"YOLO floor (its OpenCV calls in one loop, 1 thread): {statistics.median(floor):.0f} samples per CPU-second")
        for layout in args.layouts.split(","):
            key = ("this", f"YOLO/{layout}/1")
            if key in rates:
                ratio = _median_ratio(rates[key], floor)
                out.setdefault("vs_floor", {})[layout] = ratio
                print(f"  make_loader YOLO/{layout}/1 thread / floor: {ratio:.2f}")
    return out


if __name__ == "__main__":
    sys.exit(main())
