"""Boxes and masks stay on their objects through every recipe, offline variant and read-time transform.

Synthetic images hold flat-coloured rectangles, one colour per class, with boxes and masks that say
where they are. After any recipe and transform, on CPU threads and on the device path, over many
seeds: every visible colour region has a box of its class (IoU >= 0.8), no box sits on nothing, and
masks agree with the colours on >= 98% of interior pixels.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.tools.synthetic_objects import OBJECT_COLOURS, make_object_dataset
from cachekit.transforms import CenterCrop, Letterbox, RandomHorizontalFlip, RandomResizedCrop, Resize

CLASSES = 3
MIN_SIDE = 12  # regions and boxes smaller than this (in pixels) are too blurred at their edges to judge


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    return make_object_dataset(
        tmp_path_factory.mktemp("objects") / "raw", 16, size=(120, 160), classes=CLASSES
    )


def _build(raw, out, **options):
    config = dict(annotations="yolo", masks=str(raw / "masks"), workers=1, progress=False, min_visibility=0.0)
    build(raw, out, BuildConfig(**(config | options)))
    return out


@pytest.fixture(scope="module")
def caches(objects, tmp_path_factory):
    """One cache per recipe (and an offline-augmented one), small sizes."""
    tmp = tmp_path_factory.mktemp("aligned")
    return {
        "classification": _build(objects, tmp / "cls", pipeline="classification-224", size=96),
        "letterbox": _build(objects, tmp / "lb", pipeline="letterbox-640", size=128),
        "train": _build(objects, tmp / "train", pipeline="train-256", size=100),
        "none": _build(objects, tmp / "none", pipeline="none"),
        "variants": _build(
            objects, tmp / "var", pipeline="classification-224", size=80, augment=3, augment_rotate=15.0
        ),  # fmt: skip
    }


def _classes_of(image_hwc: np.ndarray) -> np.ndarray:
    """Each pixel's class by its hue (-1: the grey background, or an edge blended with it).

    By hue, so that offline variants' colour jitter (hue +-0.1 turn, saturation, brightness) keeps
    every object its class: the classes' hues are a third of a turn apart, the background has none.
    """
    hsv = cv2.cvtColor(np.ascontiguousarray(image_hwc), cv2.COLOR_RGB2HSV_FULL).astype(np.int64)
    hues = np.array([cv2.cvtColor(np.uint8([[OBJECT_COLOURS[c]]]), cv2.COLOR_RGB2HSV_FULL)[0, 0, 0]
                     for c in range(CLASSES)], dtype=np.int64)  # fmt: skip
    distance = np.abs((hsv[..., 0:1] - hues + 128) % 256 - 128)  # around the circle
    out = np.argmin(distance, axis=2)
    coloured = (hsv[..., 1] > 110) & (hsv[..., 2] > 60) & (distance.min(axis=2) < 40)
    return np.where(coloured, out, -1)


def _iou(a, b) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _inside(region, box) -> float:
    """The share of ``region`` inside ``box``."""
    ix = max(0.0, min(region[2], box[2]) - max(region[0], box[0]))
    iy = max(0.0, min(region[3], box[3]) - max(region[1], box[1]))
    return ix * iy / ((region[2] - region[0]) * (region[3] - region[1]))


def _check_sample(
    image_chw: np.ndarray, target: dict, what: str, turned: bool = False, edge: int = 2
) -> None:
    """``turned``: offline variants rotated by up to 15 degrees. A rotated rectangle fills ~2/3 of the
    upright box round it, and a cropped one's visible part may be far smaller than that box: there
    each region must lie inside a box of its class (give or take the pixel its blurred edge may
    spill); a box inside the image be a third its object (a thin turned rectangle fills less than
    half its box), and a box cut by the image's edge is not judged (the part of a turned object's box
    left by a crop may hold none of it). ``edge``: pixels next to a mask's edge that are not judged
    (more where a tiny crop is enlarged: the mask's nearest-neighbour steps are enlarged with it)."""
    covered = 0.3 if turned else 0.9
    pixels = _classes_of(image_chw.transpose(1, 2, 0))
    boxes, classes = target["boxes"].numpy(), target["classes"].numpy()
    for c in range(CLASSES):  # every visible region has a box of its class
        n, _, stats, _ = cv2.connectedComponentsWithStats((pixels == c).astype(np.uint8), connectivity=4)
        for x, y, w, h, _area in stats[1:]:
            if w < MIN_SIDE or h < MIN_SIDE:
                continue
            region = (x, y, x + w, y + h)
            if turned:
                best = max(
                    (_inside(region, b + [-1, -1, 1, 1]) for b, k in zip(boxes, classes) if k == c), default=0
                )
                assert best >= 0.9, f"{what}: a class-{c} region at {region} is in no box ({best:.2f})"
                continue
            best = max((_iou(region, b) for b, k in zip(boxes, classes) if k == c), default=0.0)
            assert best >= 0.8, f"{what}: a class-{c} region at {region} has no box (best IoU {best:.2f})"
    for b, k in zip(boxes, classes):  # no box sits on nothing
        x1, y1, x2, y2 = (int(round(v)) for v in b)
        if x2 - x1 < MIN_SIDE or y2 - y1 < MIN_SIDE:
            continue
        if turned and (x1 <= 0 or y1 <= 0 or x2 >= pixels.shape[1] or y2 >= pixels.shape[0]):
            continue
        inner = pixels[y1 + 2 : y2 - 2, x1 + 2 : x2 - 2]
        share = float((inner == k).mean())
        assert share >= covered, f"{what}: box {b.tolist()} of class {k} covers its colour on {share:.0%}"
    if "mask" in target:  # masks agree with the colours away from edges
        mask = target["mask"].numpy().astype(np.int64) - 1
        kernel = np.ones((2 * edge + 1, 2 * edge + 1), np.uint8)
        interior = np.zeros(mask.shape, dtype=bool)
        for c in range(-1, CLASSES):
            interior |= cv2.erode((mask == c).astype(np.uint8), kernel).astype(bool)
        if interior.sum() < 50:
            return
        agree = float((mask[interior] == pixels[interior]).mean())
        assert agree >= 0.98, f"{what}: mask agrees with the colours on {agree:.1%} of interior pixels"


#: Read-time transforms, each with its seed (every epoch draws anew from it).
TRANSFORMS = {
    "rrc+flip": [RandomResizedCrop(64, scale=(0.2, 1.0)), RandomHorizontalFlip()],
    "tiny crops": [RandomResizedCrop(48, scale=(0.02, 0.1)), RandomHorizontalFlip(0.5)],  # enlarged 2-4x
    "resize+center": [Resize(80), CenterCrop(64)],
    "letterbox+flip": [Letterbox(96), RandomHorizontalFlip()],
    "pad": [CenterCrop(200)],
    "fixed resize": [Resize((72, 56)), RandomHorizontalFlip(1.0)],
}


@pytest.mark.slow
@pytest.mark.parametrize("on", ["threads", "device"])
@pytest.mark.parametrize("transforms", list(TRANSFORMS))
@pytest.mark.parametrize("recipe", ["classification", "letterbox", "train", "none", "variants"])
def test_boxes_and_masks_follow_their_pixels(caches, recipe, transforms, on):
    ds = CachedDataset(caches[recipe])
    options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
    seed = sorted(TRANSFORMS).index(transforms)
    loader = make_loader(ds, 8, seed=seed, augment=TRANSFORMS[transforms], min_visibility=0.0, **options)
    edge = 5 if transforms == "tiny crops" else 2
    seen = 0
    for epoch in range(3):
        for images, targets in loader:
            images = images.numpy()
            for j, target in enumerate(targets):
                what = f"{recipe}/{transforms}/{on} epoch {epoch} sample {j}"
                _check_sample(images[j], target, what, turned=recipe == "variants", edge=edge)
                seen += 1
    assert seen == 3 * len(ds)


@pytest.mark.parametrize("recipe", ["classification", "letterbox", "variants"])
def test_stored_samples_are_aligned(caches, recipe):
    """The recipes and offline variants alone: every stored sample, as read."""
    ds = CachedDataset(caches[recipe])
    for i in range(len(ds)):
        image, target = ds[i]
        _check_sample(image.numpy(), target, f"{recipe} sample {i}", turned=recipe == "variants")
