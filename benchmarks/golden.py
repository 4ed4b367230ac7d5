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
in the data or the order shows there and not as a transform's). A batch is recorded as the
sha256 (its first 16 hex digits) of each of its outputs: images, labels, and each target key over the
batch's samples in order (boxes, classes, iscrowd, mask, ...), each with its dtype and shape.

The device path's images come from float kernels (batched matrix products, ``grid_sample``) that
round a value a level apart on another CPU (its SIMD width, its BLAS's code path), so a ``.device``
case's images are also recorded as values and compared within a level, as the docs promise
(``within_a_level``: the fractions allowed are beside it); its labels and targets (moved on the host)
and every output of the other cases are compared by digest, bit for bit. The values are stored as
their bits minus those of the same transform's ``.threads`` case (run beside it and checked
bit-identical first), mostly zeros, in an ``.npz`` beside the record (``outputs.npz``, about 1.7 MB).

The file is ``{"versions": {torch, cv2, numpy}, "transforms": {name: the list as text}, "cases":
{name: [{key: digest} per batch]}, "values": {device case: its member of the .npz}}``; the digests
of a device case's images are the recording machine's (equal ones need no values). Bit-identity is
only defined for the same kernels: a record made with other torch, cv2 or numpy versions is
reported, not compared as equal.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.catalogue import CATALOGUE
from cachekit.augment.maps import GEOMETRIC_STEPS
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

SEED = 5
EPOCHS = 3
BATCH = 6  # 16 samples: two full batches and one of 4 each epoch
SAMPLES = 16
DIGITS = 16
PATHS = {"threads": {"augment_on": "threads"}, "device": {"device": "cpu", "augment_on": "device"}}
#: The fixed size that ends a list on ``det`` (its samples vary in size): non-square, so that a
#: swapped height and width shows.
DET_SIZE = (48, 64)


def versions() -> dict[str, str]:
    return {"torch": torch.__version__, "cv2": cv2.__version__, "numpy": np.__version__}


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


# --- digests ----------------------------------------------------------------------------------------


def _leaves(value, path: str, index: tuple) -> Iterator[tuple[str, tuple, object]]:
    """(name, position, leaf) of a batch: a list's items share their name and differ in position."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}.{key}" if path else str(key), index)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[]", (*index, i))
    else:
        yield path, index, value


def _batch_parts(batch) -> dict:
    """A loader's batch as named parts: the images, then labels (a tensor) or targets, then others."""
    if not isinstance(batch, (tuple, list)):
        return {"batch": batch}
    parts = {"images": batch[0]}
    if len(batch) > 1:
        parts["labels" if isinstance(batch[1], torch.Tensor) else "targets"] = batch[1]
    for i, extra in enumerate(batch[2:], start=2):
        parts[f"out{i}"] = extra
    return parts


def _header(t: torch.Tensor) -> str:
    """What a tensor's digest holds besides its bytes: dtype, shape, and channels-last where it is."""
    last = t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)
    return f"{t.dtype}|{tuple(t.shape)}|{'channels_last|' if last else ''}"


def digest_batch(batch) -> dict[str, str]:
    """``{key: sha256}`` of each output of one batch: a tensor's dtype, shape and bytes; a list's
    items in order, each with its position (so ``targets[].boxes`` is every sample's boxes)."""
    hashes: dict[str, hashlib._Hash] = {}
    for key, index, leaf in _leaves(_batch_parts(batch), "", ()):
        h = hashes.setdefault(key, hashlib.sha256())
        if isinstance(leaf, torch.Tensor):
            t = leaf.detach().to("cpu")
            h.update(f"{index}|{_header(t)}".encode())
            t = t.contiguous()
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # scalars too
        elif isinstance(leaf, np.ndarray):
            a = np.ascontiguousarray(leaf)
            h.update(f"{index}|{a.dtype}|{a.shape}|".encode())
            h.update(a.tobytes())
        else:
            h.update(f"{index}|{type(leaf).__name__}|{leaf!r}|".encode())
    return {key: h.hexdigest()[:DIGITS] for key, h in hashes.items()}


@dataclass
class Run:
    """One case's batches: each one's digests, and its images as values (C order, with the header of
    their digest), the cache's mean and std (what ``normalize=True`` divided by; else 0 and 1), and
    whether its list amplifies a level (``AMPLIFIERS``)."""

    digests: list[dict[str, str]] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    stats: tuple = (0.0, 1.0)
    amplifies: bool = False


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
                run.digests.append(digest_batch(batch))
                images = _batch_parts(batch).get(DEVICE_KEY)
                if isinstance(images, torch.Tensor):
                    run.headers.append(_header(images.detach().to("cpu")))
                    run.images.append(images.detach().to("cpu").contiguous().numpy())
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


# --- the device path: values within a level ---------------------------------------------------------

#: The device path computes images in float (batched matrix products, ``grid_sample``, colour in fp32)
#: and rounds them; another CPU (its SIMD width, its BLAS's code path) may round a value the other way
#: where the exact result lies within float error of a half level. So a ``.device`` case's images are
#: recorded as values and compared within a level, as the docs promise; its other outputs (labels;
#: boxes and masks, moved on the host) and every output of the other cases, bit for bit. Measured
#: under ``ATEN_CPU_CAPABILITY=avx2`` and ``=default`` and ``MKL_CBWR=COMPATIBLE`` against an
#: AVX512 machine's record: at most 0.13% of a batch's values a level off, none more except where a
#: later step amplifies (below).
DEVICE_KEY = "images"
#: At most this fraction of a batch's values may differ at all (a changed rounding rule moves half).
OFF = 0.02
#: Steps after which a level in may be more out: a contrast or colour gain above 1, solarize's
#: threshold, posterize's bits, equalize's histogram, an integer hue. In a case whose list holds one,
#: at most ``AMPLIFIED`` of a batch's values may be more than a level off (measured: 0.05%, by up to
#: 204 levels); in any other, none.
AMPLIFIERS = (ColorJitter, RandomHSV, AutoAugment, RandAugment, TrivialAugmentWide)
AMPLIFIED = 0.005
#: Images are compared in levels of 255 (a normalised batch back through the cache's mean and std);
#: float images within this of each other are equal.
EPS = 1e-3


def twin(name: str) -> str | None:
    """The threads case of a device case (the base its values are recorded against), or None."""
    return name.removesuffix(".device") + ".threads" if name.endswith(".device") else None


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(f"u{a.dtype.itemsize}")


def encode_values(device: Run, threads: Run) -> np.ndarray:
    """A device case's images, as their bits minus its threads case's (unsigned, modulo: exact for
    any dtype, and mostly zeros, which compress to little)."""
    if device.headers != threads.headers:
        raise ValueError(f"device images {device.headers} unlike the threads case's {threads.headers}")
    return np.concatenate([_bits(d) - _bits(t) for d, t in zip(device.images, threads.images)])


def decode_values(diff: np.ndarray, threads: Run) -> list[np.ndarray] | None:
    """The recorded device images: the threads case's plus the recorded difference (None when it
    does not fit them)."""
    out, at = [], 0
    for t in threads.images:
        bits = _bits(t)
        if diff.dtype != bits.dtype or at + bits.size > diff.size:
            return None
        out.append((bits + diff[at : at + bits.size]).view(t.dtype).reshape(t.shape))
        at += bits.size
    return out if at == diff.size else None


def levels(images: np.ndarray, stats: tuple) -> np.ndarray:
    """Values in levels of 255: uint8 as they are; float ones through ``stats`` (mean, std) back."""
    if images.dtype == np.uint8:
        return images.astype(np.float64)
    mean, std = (np.asarray(s, np.float64).reshape(1, -1, 1, 1) for s in stats)
    return (images.astype(np.float64) * std + mean) * 255


def within_a_level(here: np.ndarray, recorded: np.ndarray, run: Run) -> str | None:
    """Why a device batch's images are not within a level of the record's, or None."""
    d = np.abs(levels(here, run.stats) - levels(recorded, run.stats))
    beyond, allowed = int((d > 1 + EPS).sum()), int(AMPLIFIED * d.size) if run.amplifies else 0
    if beyond > allowed:
        at = [int(i) for i in np.unravel_index(int(d.argmax()), d.shape)]
        largest = f"{d.max():.3g} levels at {at}"
        return f"images: {beyond} values more than a level off ({allowed} allowed; {largest})"
    off, most = int((d > EPS).sum()), int(OFF * d.size)
    return f"images: {off} values a level off ({most} allowed)" if off > most else None


def _recorded_images(name: str, expected: dict, actual: dict) -> list[np.ndarray] | str | None:
    """A device case's recorded images, rebuilt on its threads case run here (bit-identical to the
    record's, or a line says so); None where images are compared by digest (another case, or no run)."""
    runs, base = actual.get("runs", {}), twin(name)
    if base is None or name not in runs:
        return None
    diff = expected.get("values", {}).get(name)
    if diff is None:
        return "images differ (no values recorded)"
    if base not in runs:
        return f"images not compared: {base} not run"
    if [x.get(DEVICE_KEY) for x in expected["cases"].get(base, [])] != [
        y.get(DEVICE_KEY) for y in actual["cases"][base]
    ]:
        return f"images not compared: {base}'s differ from the record"
    if runs[name].headers != runs[base].headers:
        return f"images: dtype, shape or memory format unlike the record's ({base}'s)"
    images = decode_values(diff, runs[base])
    return images if images is not None else "images: recorded values of another size"


def _differences(name: str, expected: dict, actual: dict) -> list[str]:
    """Per batch, what differs from the record ("" where nothing does)."""
    a, b = expected["cases"][name], actual["cases"][name]
    recorded = None
    if any(x.get(DEVICE_KEY) != y.get(DEVICE_KEY) for x, y in zip(a, b)):
        recorded = _recorded_images(name, expected, actual)
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        what = [k for k in x if k in y and x[k] != y[k]]
        notes = []
        if DEVICE_KEY in what and recorded is not None:
            what.remove(DEVICE_KEY)
            note = recorded if isinstance(recorded, str) else within_a_level(
                actual["runs"][name].images[i], recorded[i], actual["runs"][name]
            )  # fmt: skip
            notes += [note] if note else []
        gone, new = sorted(set(x) - set(y)), sorted(set(y) - set(x))
        out.append(", ".join(
            ([f"{', '.join(what)} differ"] if what else []) + notes
            + ([f"{', '.join(gone)} missing"] if gone else []) + ([f"{', '.join(new)} new"] if new else [])
        ))  # fmt: skip
    return out


def compare(expected: dict, actual: dict, names: list[str] | None = None) -> list[str]:
    """One line per case that differs: the first batch and what changed there (keys, or a device
    case's images beyond a level: ``within_a_level``), a batch count, a case missing from either side.
    A device case's images are compared as values where ``actual["runs"]`` holds it and its threads
    case; by digest where not. ``names``: only these cases."""
    want, got = expected["cases"], actual["cases"]
    problems = []
    for name in names if names is not None else sorted(set(want) | set(got)):
        if name not in got:
            problems.append(f"{name}: recorded, not run")
            continue
        if name not in want:
            problems.append(f"{name}: run, not recorded")
            continue
        if len(want[name]) != len(got[name]):
            problems.append(f"{name}: {len(got[name])} batches, {len(want[name])} recorded")
            continue
        details = _differences(name, expected, actual)
        first = next((i for i, d in enumerate(details) if d), None)
        if first is None:
            continue
        epoch, batch = divmod(first, len(details) // EPOCHS)
        later = sum(bool(d) for d in details[first + 1 :])
        problems.append(f"{name}: batch {first} (epoch {epoch}, batch {batch}): {details[first]}"
                        + (f"; {later} later batches differ too" if later else ""))  # fmt: skip
    return problems


def version_mismatch(expected: dict) -> str | None:
    """Why a record cannot be compared bit for bit here (other kernels), or None."""
    now, then = versions(), expected.get("versions", {})
    diff = [f"{k} {then.get(k)} recorded, {now[k]} here" for k in now if then.get(k) != now[k]]
    return "; ".join(diff) or None


def _member(values: np.ndarray) -> str:
    return hashlib.sha256(f"{values.dtype}|".encode() + values.tobytes()).hexdigest()[:DIGITS]


def dumps(result: dict) -> str:
    """The record as JSON, one case a line (a change shows as the lines of its cases); ``values``
    names each device case's member of the ``.npz`` beside it (its content's digest)."""
    sections = {
        "transforms": result["transforms"],
        "cases": result["cases"],
        "values": {name: _member(v) for name, v in result["values"].items()},
    }
    lines = ["{", f' "versions": {json.dumps(result["versions"], sort_keys=True)},']
    for section, entries in sections.items():
        items = sorted(entries.items())
        lines.append(f' "{section}": {{')
        lines += [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if i < len(items) - 1 else "")
                  for i, (k, v) in enumerate(items)]  # fmt: skip
        lines.append(" }" if section == "values" else " },")
    return "\n".join([*lines, "}"]) + "\n"


def values_path(record: str | Path) -> Path:
    """Where a record's values lie: beside it, ``.npz`` for ``.json``."""
    return Path(record).with_suffix(".npz")


def write_record(path: str | Path, result: dict) -> None:
    """The record's JSON, and its values as an ``.npz``: one member per distinct array (the layouts
    of one recipe share theirs), deflated, dated 1980 so that the same values give the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    members = {_member(v): v for v in result["values"].values()}
    with zipfile.ZipFile(values_path(path), "w") as z:
        for name in sorted(members):
            data = io.BytesIO()
            np.lib.format.write_array(data, members[name], allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            z.writestr(info, data.getvalue(), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    path.write_text(dumps(result))


def read_record(path: str | Path) -> dict:
    """A record as ``run_all`` gives it (less runs): its JSON, each device case's values read from the
    ``.npz`` beside it."""
    record = json.loads(Path(path).read_text())
    if not isinstance(record, dict) or not {"cases", "versions"} <= set(record):
        raise ValueError("no cases and versions")
    names = record.get("values", {})
    if names:
        with np.load(values_path(path), allow_pickle=False) as z:
            members = {m: z[m] for m in set(names.values())}
        record["values"] = {name: members[m] for name, m in names.items()}
    return record


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
