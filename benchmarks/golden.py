"""Golden outputs of read-time augmentation: every batch every transform gives, recorded, so that a
change meant to keep the outputs (a refactor of ``cachekit/augment/``) can show them kept: bit-identical
where the code computes in integers, within a level where the device path computes in float.

    python benchmarks/golden.py --write tests/augment/golden/outputs.json   # record from this code
    python benchmarks/golden.py --check tests/augment/golden/outputs.json   # compare with a record
    python benchmarks/golden.py --check FILE --only det.Mosaic              # cases whose names contain it

Three small caches are built from code (synthetic numpy images, ``cachekit.build``): ``cls``, a
classification cache of 40x40 samples with four classes; ``det``, detection samples of two non-square
sizes (60x80 and 72x56) with boxes, classes and a class-map mask; ``boxes``, the same images with
their boxes alone (``collate="yolo"`` refuses masks). Every transform of the catalogue
(``cachekit.augment.catalogue.CATALOGUE``) runs alone with parameters that make it act (``p=1``
where there is a ``p``; on ``det`` followed by a fixed ``Resize``, since its samples vary in size),
on ``cls`` and on ``det`` where it applies, with a few variants where a parameter switches code
(``expand``, ``perspective``, AutoAugment's policies, RandomErasing's values, Mosaic's ``p``); the
DeiT and YOLO recipes of README.md run as written there at small sizes (YOLO with its
``close_mosaic`` for the last epoch). ``layout.*`` runs RandomResizedCrop + flip and both recipes
from the caches stored channels-last (``cls-hwc``, ``boxes-hwc``: ``--store pixels-hwc``) and
with ``channels_last=True`` batches, from either store (their digests are of the values, and a
channels-last batch says so in its key). Each case reads 3 epochs with a fixed seed, on CPU threads
(``augment_on="threads"``) and on the device path run on the CPU (``device="cpu",
augment_on="device"``), and ``stored.*`` reads each cache without augmentation (so that a change
in the data or the order shows there and not as a transform's).

Here: the caches, the cases, running them, the command line. How a batch is recorded (digests, and
a device case's images as values), compared and stored: ``goldenvalues.py`` beside it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.catalogue import CATALOGUE, GEOMETRIC_STEPS
from cachekit.augment.spec import format_spec
from cachekit.augment.transforms import TRANSFORMS
from cachekit.tools.synthetic import synthetic_image
from cachekit.transforms import (
    AutoAugment,
    CenterCrop,
    ColorJitter,
    CutMix,
    GaussianBlur,
    Letterbox,
    MixUp,
    MixUpOrCutMix,
    Mosaic,
    RandAugment,
    RandomAffine,
    RandomErasing,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomHSV,
    RandomIoUCrop,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    RandomZoomOut,
    Resize,
    TrivialAugmentWide,
)

sys.path.append(str(Path(__file__).resolve().parent))  # goldenvalues.py, however this file is loaded
from goldenvalues import (
    DEVICE_KEY,
    EPOCHS,
    Run,
    compare,
    encode_values,
    read_record,
    twin,
    values_path,
    version_mismatch,
    versions,
    write_record,
)

SEED = 5
BATCH = 6  # 16 samples: two full batches and one of 4 each epoch
SAMPLES = 16
PATHS = {"threads": {"augment_on": "threads"}, "device": {"device": "cpu", "augment_on": "device"}}
#: The fixed size that ends a list on ``det`` (its samples vary in size): non-square, so that a
#: swapped height and width shows.
DET_SIZE = (48, 64)


# --- the caches -------------------------------------------------------------------------------------


def _classification_samples() -> Iterator:
    for i in range(SAMPLES):
        rng = np.random.default_rng([11, i])
        yield synthetic_image(rng, 44, 52), i % 4


def _detection_samples(masks: bool) -> Iterator:
    colours = ((230, 30, 30), (30, 220, 40), (40, 50, 235))
    for i in range(SAMPLES):
        rng = np.random.default_rng([12, i])
        h, w = (60, 80) if i % 2 else (72, 56)
        image = synthetic_image(rng, h, w)
        mask = np.zeros((h, w), np.uint8)
        boxes, classes = [], []
        for _ in range(int(rng.integers(1, 5))):
            bw, bh = int(rng.integers(6, w // 2)), int(rng.integers(6, h // 2))
            x, y, c = (
                int(rng.integers(0, w - bw + 1)),
                int(rng.integers(0, h - bh + 1)),
                int(rng.integers(0, 3)),
            )
            image[y : y + bh, x : x + bw] = colours[c]
            mask[y : y + bh, x : x + bw] = c + 1
            boxes.append([x, y, x + bw, y + bh])
            classes.append(c)
        target = {"boxes": np.array(boxes, np.float32), "classes": np.array(classes, np.int64)}
        if masks:
            target["mask"] = mask
        yield image, target


def build_caches(folder: str | Path) -> dict[str, Path]:
    """The three caches under ``folder``: ``cls`` (40x40, 4 classes), ``det`` (boxes and masks, two
    non-square sizes), ``boxes`` (the same boxes, no masks)."""
    folder = Path(folder)
    quiet = {"workers": 1, "progress": False, "shard_size": 5}
    paths = {name: folder / name for name in ("cls", "det", "boxes", "cls-hwc", "boxes-hwc")}
    build(_classification_samples(), paths["cls"], BuildConfig(pipeline="classification-224", size=40, **quiet),
          classes=[f"class_{c}" for c in range(4)])  # fmt: skip
    names = ["red", "green", "blue"]
    build(_detection_samples(True), paths["det"], BuildConfig(pipeline="none", **quiet), classes=names)
    build(_detection_samples(False), paths["boxes"], BuildConfig(pipeline="none", **quiet), classes=names)
    build(_classification_samples(), paths["cls-hwc"], BuildConfig(pipeline="classification-224", size=40,
          store="pixels-hwc", **quiet), classes=[f"class_{c}" for c in range(4)])  # fmt: skip
    build(_detection_samples(False), paths["boxes-hwc"], BuildConfig(pipeline="none", store="pixels-hwc", **quiet),
          classes=names)  # fmt: skip
    return paths


# --- the cases --------------------------------------------------------------------------------------

#: Steps after which a level in may be more out (a device case's images may then be further off than
#: a level: ``goldenvalues.AMPLIFIED``): a contrast or colour gain above 1, solarize's threshold,
#: posterize's bits, equalize's histogram, an integer hue.
AMPLIFIERS = (ColorJitter, RandomHSV, AutoAugment, RandAugment, TrivialAugmentWide)


@dataclass(frozen=True)
class Case:
    """One loader: the cache it reads, its list, ``make_loader``'s other options, and the list
    ``set_augment`` gives the last epoch (None: the same all along)."""

    cache: str
    augment: list | None
    options: dict = field(default_factory=dict)
    last_epoch: list | None = None

    def amplifies(self) -> bool:
        """Whether a step of its lists may turn a level in into more out (``AMPLIFIERS``)."""
        return any(isinstance(s, AMPLIFIERS) for s in (self.augment or []) + (self.last_epoch or []))


#: Each transform of the catalogue, acting: name -> (transform, the caches it runs on). Variants carry
#: a suffix. On ``det`` a transform that fixes the output's size runs as it is, any other with
#: ``Resize(DET_SIZE)`` (``_on_det``); on ``cls`` alone (with the resize when it changes the size).
ALONE: dict[str, tuple[object, str]] = {
    "RandomResizedCrop": (RandomResizedCrop((40, 56)), "cls det"),
    "RandomHorizontalFlip": (RandomHorizontalFlip(1.0), "cls det"),
    "ColorJitter": (ColorJitter(0.4, 0.4, 0.4, 0.1), "cls det"),
    "CenterCrop": (CenterCrop((40, 56)), "cls det"),
    "Resize": (Resize((44, 60)), "cls det"),
    "Resize-shorter": (Resize(36), "cls"),  # on det, the Resize after it would undo it
    "Letterbox": (Letterbox(64), "cls det"),
    "RandomVerticalFlip": (RandomVerticalFlip(1.0), "cls det"),
    "RandomRotation": (RandomRotation(20), "cls det"),
    "RandomRotation-expand": (RandomRotation((-30, 30), expand=True, fill=114), "cls det"),
    "RandomAffine": (RandomAffine(15, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10, fill=114), "cls det"),
    "RandomAffine-perspective": (RandomAffine(5, scale=(0.8, 1.2), perspective=0.001), "cls det"),
    "RandomPerspective": (RandomPerspective(0.4, p=1.0), "cls det"),
    "RandomZoomOut": (RandomZoomOut(side_range=(1.0, 2.0), p=1.0), "cls det"),
    "RandomIoUCrop": (RandomIoUCrop(), "det"),  # needs boxes
    "Mosaic": (Mosaic(64), "det"),  # needs boxes or masks
    "Mosaic-half": (Mosaic(64, p=0.5), "det"),
    "RandAugment": (RandAugment(2, 9), "cls det"),
    "RandAugment-strong": (RandAugment(4, 20, fill=(10, 20, 30)), "det"),
    "TrivialAugmentWide": (TrivialAugmentWide(), "cls det"),
    "AutoAugment": (AutoAugment("imagenet"), "cls det"),
    "AutoAugment-cifar10": (AutoAugment("cifar10", fill=(20, 40, 60)), "det"),
    "AutoAugment-svhn": (AutoAugment("svhn"), "det"),
    "RandomErasing": (RandomErasing(1.0), "cls det"),
    "RandomErasing-random": (RandomErasing(1.0, value="random"), "cls det"),
    "RandomErasing-value": (RandomErasing(1.0, value=(1, 2, 3)), "det"),
    "RandomGrayscale": (RandomGrayscale(1.0), "cls det"),
    "GaussianBlur": (GaussianBlur(5, sigma=(0.5, 2.0)), "cls det"),
    "RandomHSV": (RandomHSV(), "cls det"),
}

#: The batch transforms: classification caches' soft labels, and Ultralytics' MixUp on detection.
BATCH_CASES = {
    "cls.MixUp": Case("cls", [RandomResizedCrop(32), MixUp()]),
    "cls.CutMix": Case("cls", [RandomResizedCrop(32), CutMix()]),
    "cls.MixUpOrCutMix": Case("cls", [RandomResizedCrop(32), MixUpOrCutMix()]),
    "det.MixUp": Case("det", [Resize(DET_SIZE), MixUp()]),
}

#: README's "Training recipes" at small sizes: DeiT (normalised, soft labels) and YOLO (Ultralytics'
#: rows, mosaic closed for the last epoch).
_YOLO_TAIL = [
    RandomAffine(degrees=0, translate=(0.1, 0.1), scale=(0.5, 1.5), fill=114),
    RandomHSV(h=0.015, s=0.7, v=0.4),
    RandomHorizontalFlip(),
]
RECIPES = {
    "recipe.DeiT": Case(
        "cls",
        [
            RandomResizedCrop(32),
            RandomHorizontalFlip(),
            RandAugment(num_ops=2, magnitude=9),
            RandomErasing(0.25),
            MixUp(0.8),
            CutMix(1.0),
        ],
        {"normalize": True},
    ),  # fmt: skip
    "recipe.YOLO": Case(
        "boxes", [Mosaic(64), *_YOLO_TAIL], {"collate": "yolo"}, [Letterbox(64), *_YOLO_TAIL]
    ),
}


#: The stores and memory formats of a batch: the same recipes from the default store and from a cache
#: stored channels-last (``--store pixels-hwc``), each as planes and as ``channels_last=True`` batches.
#: name -> (the cache's suffix, channels_last).
LAYOUTS = {"planes": ("", False), "hwc": ("-hwc", False), "hwc-cl": ("-hwc", True), "cl": ("", True)}
LAYOUT_RECIPES = {
    "RRC-flip": Case("cls", [RandomResizedCrop((40, 56)), RandomHorizontalFlip()]),
    "DeiT": RECIPES["recipe.DeiT"],
    "YOLO": RECIPES["recipe.YOLO"],
}


def _fixes_size(step) -> bool:
    return isinstance(step, (RandomResizedCrop, CenterCrop, Letterbox, Mosaic)) or (
        isinstance(step, Resize) and not isinstance(step.size, int)
    )


def _geometric(step) -> bool:
    return isinstance(step, (*TRANSFORMS, *GEOMETRIC_STEPS)) and not isinstance(step, ColorJitter)


def _varies_size(step) -> bool:
    return isinstance(step, (RandomZoomOut, RandomIoUCrop)) or (
        isinstance(step, RandomRotation) and step.expand
    )


def _on_det(step) -> list:
    """``step`` alone on ``det``, whose samples vary in size: a list that ends in a fixed size."""
    if _fixes_size(step):
        return [step]
    if _geometric(step):
        return [step, Resize(DET_SIZE)]
    return [Resize(DET_SIZE), step]  # a pixel transform runs after the geometry, and is listed after it


def cases() -> dict[str, Case]:
    """Every case by name: ``<cache>.<transform>[-variant].<threads|device>``, the recipes, ``stored.*``."""
    base: dict[str, Case] = {}
    for name, (step, on) in ALONE.items():
        if "det" in on:
            base[f"det.{name}"] = Case("det", _on_det(step))
        if "cls" in on:
            base[f"cls.{name}"] = Case("cls", [step, Resize(DET_SIZE)] if _varies_size(step) else [step])
    base["det.none"] = Case("det", [Resize(DET_SIZE)])  # what a transform that does nothing gives there
    base.update(BATCH_CASES)
    base.update(RECIPES)
    for recipe, case in LAYOUT_RECIPES.items():
        for layout, (suffix, last) in LAYOUTS.items():
            options = {**case.options, "channels_last": last}
            base[f"layout.{recipe}.{layout}"] = Case(case.cache + suffix, case.augment, options, case.last_epoch)
    every = {f"{name}.{path}": case for name, case in base.items() for path in PATHS}
    for cache in ("cls", "det", "boxes", "cls-hwc", "boxes-hwc"):
        every[f"stored.{cache}"] = Case(cache, None, {"pad": not cache.startswith("cls")})
    return every


def _path_options(name: str) -> dict:
    return PATHS[name.rsplit(".", 1)[1]] if name.rsplit(".", 1)[1] in PATHS else {}


def uncovered() -> list[str]:
    """The catalogue's transforms no case runs (none, or a new transform needs its case)."""
    run = {type(s) for c in cases().values() for s in (c.augment or []) + (c.last_epoch or [])}
    return [t.__name__ for t in CATALOGUE if t not in run]


# --- running them -----------------------------------------------------------------------------------


def run_case(name: str, case: Case, caches: dict[str, Path]) -> Run:
    """Every batch of ``EPOCHS`` epochs of one case, in order. One thread, and torch's kernels on one
    thread (a float sum's order must not follow the machine's core count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loader = make_loader(str(caches[case.cache]), BATCH, seed=SEED, augment=case.augment, threads=1,
                             **case.options, **_path_options(name))  # fmt: skip
        run = Run(amplifies=case.amplifies())
        if case.options.get("normalize"):
            manifest = CachedDataset(str(caches[case.cache])).manifest
            run.stats = (np.asarray(manifest.mean, np.float64), np.asarray(manifest.std, np.float64))
        for epoch in range(EPOCHS):
            if case.last_epoch is not None and epoch == EPOCHS - 1:
                loader.set_augment(case.last_epoch)
            for batch in loader:
                run.add(batch)
        return run
    finally:
        torch.set_num_threads(threads)


def run_all(caches: dict[str, Path], only: Callable[[str], bool] = lambda name: True) -> dict:
    """The cases ``only`` picks, and the threads case of each device case picked (the base of its
    values): their digests, runs, lists as text, and each device case's values (``encode_values``)."""
    every = cases()
    chosen = [n for n in every if only(n)]
    names = [n for n in every if n in chosen or n in {twin(c) for c in chosen}]
    runs = {n: run_case(n, every[n], caches) for n in names}
    return {
        "versions": versions(),
        "cases": {n: runs[n].digests for n in names},
        "transforms": {n: format_spec(every[n].augment) if every[n].augment else None for n in names},
        "values": {n: encode_values(runs[n], runs[twin(n)]) for n in names if twin(n)},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="FILE", help="save this code's outputs (and FILE's .npz)")
    mode.add_argument("--check", metavar="FILE", help="compare this code's outputs with a saved file")
    mode.add_argument("--list", action="store_true", help="print the case names")
    parser.add_argument("--only", action="append", default=[], help="cases whose names contain this")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(cases()))
        return 0
    if args.write and args.only:
        print("--write records every case; leave out --only", file=sys.stderr)
        return 2
    expected = None
    if args.check:
        try:
            expected = read_record(args.check)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            print(f"{args.check}: not a record of golden outputs ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    only = (lambda n: any(s in n for s in args.only)) if args.only else (lambda n: True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        result = run_all(build_caches(tmp), only)
    seconds = time.perf_counter() - start
    if args.write:
        write_record(args.write, result)
        written = f"{args.write} and {values_path(args.write)}"
        print(f"{len(result['cases'])} cases written to {written} in {seconds:.1f} s")
        return 0
    mismatch = version_mismatch(expected)
    if mismatch:
        print(f"versions differ ({mismatch}): bit-identity is not defined across kernels", file=sys.stderr)
    chosen = [n for n in result["cases"] if only(n)]
    problems = compare(expected, result, chosen if args.only else None)
    for line in problems:
        print(line)
    recorded = expected["cases"]
    inexact = [n for n in chosen if twin(n) and n in recorded and any(
        x.get(DEVICE_KEY) != y.get(DEVICE_KEY) for x, y in zip(recorded[n], result["cases"][n]))]  # fmt: skip
    agree = f"all agree, {len(inexact)} device cases within a level" if inexact else "all identical"
    print(f"{len(chosen)} cases in {seconds:.1f} s ({torch.backends.cpu.get_cpu_capability()}): "
          + (f"{len(problems)} differ" if problems else agree))  # fmt: skip
    return 1 if problems or mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
