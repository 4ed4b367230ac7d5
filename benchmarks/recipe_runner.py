"""The recipes the benchmarks time, and a child process that times passes of one of them on request.

    PYTHONPATH=CHECKOUT python benchmarks/recipe_runner.py RECIPE --raw RAW --cache CACHE [--threads 1]

``RECIPE`` is ``rrc`` (RandomResizedCrop(224) + flip), ``deit`` or ``yolo``, as ``recipe`` below
spells them with the ``cachekit.transforms`` of whichever checkout is imported: run with another
checkout on ``PYTHONPATH`` it times that checkout's ``make_loader`` (``recipe_floors.py``'s
``parent`` suite does, rounds interleaved with this checkout's). The cache is built from ``RAW`` by
that same checkout when it is missing (``train-256`` for rrc and deit; YOLO labels with the longer
side at 640 for yolo), so each checkout reads a cache it wrote.

Protocol: one JSON line when ready (``{"ready": true, "cachekit": <its path>}``), then for each line
``pass`` on standard input one timed pass over the cache, answered by ``{"samples": n, "wall": s,
"cpu": s}`` (CPU seconds of this process, all its threads, and of any worker processes); ``quit`` or
the end of input ends it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

__all__ = ["RECIPES", "CACHE_KINDS", "YOLO_FILL", "recipe", "build_cache", "cpu_seconds"]

RECIPES = ("rrc", "deit", "yolo")
#: The cache each recipe reads: ImageNet-like images at 256 on their shorter side, or YOLO labels.
CACHE_KINDS = {"rrc": "cls", "deit": "cls", "yolo": "det"}
#: Ultralytics' grey, on both sides of every YOLO comparison: its mosaic canvas and its affine's border.
YOLO_FILL = 114


def recipe(name: str) -> list:
    """The transforms of recipe ``name`` (``rrc``, ``deit``, ``yolo``) from the cachekit imported."""
    import cachekit.transforms as T

    if name == "rrc":
        return [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    if name == "deit":
        return [
            T.RandomResizedCrop(224),
            T.RandomHorizontalFlip(),
            T.RandAugment(num_ops=2, magnitude=9),
            T.RandomErasing(0.25),
            T.MixUp(0.8),
            T.CutMix(1.0),
        ]
    if name == "yolo":  # Ultralytics' default training augmentation (no MixUp), its fill
        return [
            T.Mosaic(640, fill=YOLO_FILL),
            T.RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5), fill=YOLO_FILL),
            T.RandomHSV(h=0.015, s=0.7, v=0.4),
            T.RandomHorizontalFlip(),
        ]
    raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")


def build_cache(kind: str, raw: Path, cache: Path) -> Path:
    """The cache of ``kind`` ("cls" or "det") from ``raw``, built by the cachekit imported if missing."""
    from cachekit import BuildConfig, build

    if not cache.is_dir():
        if kind == "cls":
            config = BuildConfig(pipeline="train-256", progress=False)
        else:  # the longer side at 640, as Ultralytics' load_image and image cache keep them
            config = BuildConfig(annotations="yolo", pipeline="max-side-512", size=640, progress=False)
        build(raw, cache, config)
    return cache


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its live children."""
    total = time.process_time()
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is installed with cachekit's benchmarks
        return total
    for child in psutil.Process().children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def timed_pass(loader) -> dict:
    t0, c0, n = time.perf_counter(), cpu_seconds(), 0
    for batch in loader:
        n += len(batch[0])
    return {"samples": n, "wall": time.perf_counter() - t0, "cpu": cpu_seconds() - c0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=RECIPES)
    parser.add_argument("--raw", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import cachekit
    from cachekit import make_loader

    cache = build_cache(CACHE_KINDS[args.recipe], args.raw, args.cache)
    loader = make_loader(cache, args.batch_size, augment=recipe(args.recipe), threads=args.threads)
    for _ in loader:  # warm-up: threads start, the page cache fills
        pass
    print(json.dumps({"ready": True, "cachekit": str(Path(cachekit.__file__).parent)}), flush=True)
    for line in sys.stdin:
        if line.strip() != "pass":
            break
        print(json.dumps(timed_pass(loader)), flush=True)


if __name__ == "__main__":
    main()
