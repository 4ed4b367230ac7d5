"""Each recipe against its floor, and against another checkout (the parent commit), per CPU-second.

floors  make_loader on one thread against the recipe's kernels in one loop over the same cached
        samples with nothing around them (no loader, no draws machinery, no collate: parameters
        drawn before the clock starts, pixels read once beforehand, one preallocated batch):
          rrc   the crop merged to channels-last, resized with cachekit's resize (torch's
                antialiased bilinear when shrinking, OpenCV's bilinear when enlarging), a flip, the
                split into the batch's planes
          deit  the same, then RandAugment(2, 9)'s two ops (recipe_baselines.py's look-up tables,
                addWeighted, nearest warpAffine, each checked against cachekit's kernel), erasing,
                and per batch MixUp (addWeighted) or CutMix (a pasted box)
          yolo  the mosaic's canvas, only the window the warp reads (fill 114, the tiles resized to
                640 on their longer side where they are not, pasted channels-last), one warpAffine
                with the flip folded in, RGB->HSV, one three-channel LUT, HSV->RGB, the split into
                the batch's planes (pixels only: the boxes are not moved)
        make_loader / floor per CPU-second, 1 thread, rounds interleaved: >= 1 means make_loader
        costs no more than its bare kernels.
parent  (needs --parent-tree PATH, another checkout) the same make_loader recipe run by this
        checkout and by PATH, each in a child process (recipe_runner.py, PYTHONPATH set to its
        checkout, each reading a cache it built from the same images), rounds interleaved; ours /
        parent per CPU-second and per wall second for rrc, deit and yolo at 1 and 2 threads.

Figures are medians of the per-round ratios.
"""

from __future__ import annotations

import json
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
from feed_suites import _train256
from recipe_baselines import (
    canvas_window,
    crop_resize,
    deit_sample,
    draw_erase,
    draw_mix,
    draw_ops,
    into_planes,
    mix_batch,
    resize_antialiased,
    window_canvas,
    yolo_matrix,
    yolo_pixels,
)
from recipe_runner import CACHE_KINDS, RECIPES, recipe
from recipe_suites import _detection_cache, _detection_raw
from registry import suite, synthetic_raw

from cachekit import CachedDataset, make_loader
from cachekit.tools.baselines import rrc_params

__all__ = ["Floor", "floors", "parent"]

HERE = Path(__file__).resolve().parent


class Floor:
    """Recipe ``name``'s kernels over ``images`` (``[C, H, W]`` arrays read beforehand) in batches of
    ``batch_size``; ``draw()`` the parameters of a pass (before the clock), ``run(params)`` the pass."""

    def __init__(self, name: str, images: list[np.ndarray], batch_size: int) -> None:
        self.name, self.images, self.batch_size = name, images, batch_size
        self.size = 640 if name == "yolo" else 224
        self.out = np.empty((batch_size, 3, self.size, self.size), np.uint8)

    def draw(self, seed: int) -> list:
        draw, n, s = random.Random(seed), len(self.images), self.size
        order = list(range(n))
        draw.shuffle(order)
        params = []
        for start in range(0, n, self.batch_size):
            batch = []
            for i in order[start : start + self.batch_size]:
                if self.name == "yolo":
                    xc, yc = int(draw.uniform(s // 2, 3 * s // 2)), int(draw.uniform(s // 2, 3 * s // 2))
                    tiles = [i] + [draw.randrange(n) for _ in range(3)]
                    matrix = yolo_matrix(
                        s, draw.uniform(0.5, 1.5), draw.uniform(0.4, 0.6), draw.uniform(0.4, 0.6)
                    )
                    gains = [draw.uniform(-1, 1) * g for g in (0.015, 0.7, 0.4)]
                    batch.append((tiles, xc, yc, matrix, gains, draw.random() < 0.5))
                    continue
                h, w = self.images[i].shape[1:]
                box = rrc_params(h, w, rng=draw)
                flip = draw.random() < 0.5
                if self.name == "rrc":
                    batch.append((i, box, flip))
                else:
                    batch.append((i, box, flip, draw_ops(2, 9, s, s, draw), draw_erase(s, 0.25, draw)))
            params.append((batch, draw_mix(s, s, draw) if self.name == "deit" else None))
        return params

    def run(self, params: list) -> int:
        images, out, s, done = self.images, self.out, self.size, 0
        for batch, mix in params:
            for j, p in enumerate(batch):
                if self.name == "rrc":
                    i, box, flip = p
                    img = crop_resize(images[i], box, (s, s), resize_antialiased)
                    into_planes(cv2.flip(img, 1) if flip else img, out[j])
                elif self.name == "deit":
                    i, box, flip, ops, erase = p
                    deit_sample(images[i], box, flip, ops, erase, out[j], resize_antialiased)
                else:
                    tiles, xc, yc, matrix, gains, flip = p
                    window = canvas_window(matrix, s, 2 * s)
                    canvas = window_canvas([images[t] for t in tiles], xc, yc, s, window)
                    shifted = matrix @ np.array([[1, 0, window[0]], [0, 1, window[1]], [0, 0, 1]], float)
                    yolo_pixels(canvas, shifted, gains, flip, s, out[j])
            if mix is not None:
                mix_batch(out[: len(batch)], *mix)
            done += len(batch)
        return done


def _cache_of(name: str, args, root: Path) -> Path:
    return _train256(args, root) if CACHE_KINDS[name] == "cls" else _detection_cache(args, root)


def _cpu_pass(fn, arg) -> tuple[int, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    n = fn(arg)
    return n, time.perf_counter() - t0, time.process_time() - c0


def _loader_pass(loader) -> int:
    return sum(len(batch[0]) for batch in loader)


@suite
def floors(args, root):
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    out = {}
    for name in RECIPES:
        cache = _cache_of(name, args, root)
        ds = CachedDataset(cache)
        images = [np.ascontiguousarray(ds[i][0].numpy()) for i in range(len(ds))]
        floor = Floor(name, images, args.batch_size)
        loader = make_loader(cache, args.batch_size, augment=recipe(name), threads=1)
        _loader_pass(loader), floor.run(floor.draw(0))  # warm-up
        ours, bare = [], []
        for r in range(args.repeats):
            ours.append(_cpu_pass(_loader_pass, loader))
            bare.append(_cpu_pass(floor.run, floor.draw(r + 1)))
        per_cpu = statistics.median((a[0] / a[2]) / (b[0] / b[2]) for a, b in zip(ours, bare))
        per_wall = statistics.median((a[0] / a[1]) / (b[0] / b[1]) for a, b in zip(ours, bare))
        row = {
            "make_loader_samples_per_cpu_s": statistics.median(a[0] / a[2] for a in ours),
            "floor_samples_per_cpu_s": statistics.median(b[0] / b[2] for b in bare),
            "ratio_per_cpu": per_cpu,
            "ratio_per_wall": per_wall,
            "rounds_per_cpu": [round((a[0] / a[2]) / (b[0] / b[2]), 3) for a, b in zip(ours, bare)],
        }
        print(
            f"{name}: make_loader {row['make_loader_samples_per_cpu_s']:,.0f}, floor "
            f"{row['floor_samples_per_cpu_s']:,.0f} samples per CPU-second (1 thread); make_loader / floor "
            f"{per_cpu:.2f}x per CPU-second (rounds {row['rounds_per_cpu']}), {per_wall:.2f}x per wall second"
        )
        out[name] = row
    return out


# -- the parent -------------------------------------------------------------------------------------


class _Runner:
    """A ``recipe_runner.py`` child with ``tree`` on its PYTHONPATH."""

    def __init__(self, tree: Path, name: str, raw: Path, cache: Path, batch_size: int, threads: int) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, str(HERE / "recipe_runner.py"), name, "--raw", str(raw), "--cache", str(cache)]
        cmd += ["--batch-size", str(batch_size), "--threads", str(threads)]
        self.tree = tree
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = self._answer()
        if Path(ready["cachekit"]).resolve().parent != tree.resolve():
            self.close()
            raise RuntimeError(f"the child imported cachekit from {ready['cachekit']}, not from {tree}")

    def _answer(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                code = self.proc.wait()
                raise RuntimeError(f"recipe_runner.py with {self.tree} on PYTHONPATH exited ({code})")
            if line.startswith("{"):  # anything else the child printed is not an answer
                return json.loads(line)

    def timed_pass(self) -> dict:
        self.proc.stdin.write("pass\n")
        self.proc.stdin.flush()
        return self._answer()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        self.proc.wait(timeout=120)


def _ratio(ours: list[dict], theirs: list[dict], per: str) -> float:
    return statistics.median((a["samples"] / a[per]) / (b["samples"] / b[per]) for a, b in zip(ours, theirs))


@suite
def parent(args, root):
    tree = getattr(args, "parent_tree", None)
    if not tree:
        print("parent: skipped: pass --parent-tree PATH (a checkout, e.g. git worktree add /tmp/parent REV)")
        return {"skipped": True}
    trees = {"ours": HERE.parent, "parent": Path(tree).resolve()}
    raws = {"cls": synthetic_raw(args, root), "det": _detection_raw(args, root)}
    out: dict = {}
    for name in RECIPES:
        kind = CACHE_KINDS[name]
        for threads in (1, 2):
            runners: dict[str, _Runner] = {}
            passes: dict[str, list[dict]] = {tag: [] for tag in trees}
            try:
                for tag, path in trees.items():
                    cache = root / f"{tag}-{kind}-{raws[kind].name}"
                    runners[tag] = _Runner(path, name, raws[kind], cache, args.batch_size, threads)
                for r in range(args.repeats):  # alternate who goes first
                    for tag in list(runners)[:: 1 if r % 2 == 0 else -1]:
                        passes[tag].append(runners[tag].timed_pass())
            except (RuntimeError, ValueError) as error:  # a checkout without the recipe: say so, go on
                print(f"{name}, {threads} thread(s): skipped: {error}")
                out[f"{name}/{threads}"] = {"skipped": True, "error": str(error)}
                continue
            finally:
                for runner in runners.values():
                    runner.close()
            row = {
                "ratio_per_cpu": _ratio(passes["ours"], passes["parent"], "cpu"),
                "ratio_per_wall": _ratio(passes["ours"], passes["parent"], "wall"),
                **{
                    f"{tag}_samples_per_cpu_s": statistics.median(p["samples"] / p["cpu"] for p in ps)
                    for tag, ps in passes.items()
                },
            }
            print(
                f"{name}, {threads} thread(s): ours {row['ours_samples_per_cpu_s']:,.0f}, parent "
                f"{row['parent_samples_per_cpu_s']:,.0f} samples per CPU-second; ours / parent "
                f"{row['ratio_per_cpu']:.2f}x per CPU-second, {row['ratio_per_wall']:.2f}x per wall second"
            )
            out[f"{name}/{threads}"] = row
    out["parent_tree"] = str(trees["parent"])
    return out
