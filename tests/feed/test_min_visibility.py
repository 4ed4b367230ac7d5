"""``min_visibility`` on the general-map path (rotations, affine maps, ...), through ``make_loader``, on
CPU threads and on the device path, for a cache with boxes alone and one with boxes and masks.

Maps with a known answer: ``RandomAffine(scale=(2, 2))`` doubles about the centre of a 160x120 image
(``x -> 2x - 80``, ``y -> 2y - 60``), ``RandomRotation((90, 90))`` turns it counter-clockwise
(``x -> y + 20``, ``y -> 140 - x``); the cache keeps each sample's size, so each list ends in a
``Resize`` to that size (a scale of one). Boxes end a known share inside: 0.5 keeps those with 60% or 70%
inside, drops those with 30% or 40%; 0 keeps all.
"""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import (
    Mosaic,
    RandomAffine,
    RandomIoUCrop,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    RandomZoomOut,
    Resize,
)

HEIGHT, WIDTH = 120, 160

#: box (xyxy, stored pixels) -> its share inside after each map, per class (the class names the box)
SCALE_BOXES = {
    0: ([36, 50, 46, 70], 0.6),  # left edge: x 36-46 -> -8..12
    1: ([34, 40, 44, 50], 0.4),  # left edge: x 34-44 -> -12..8
    2: ([70, 55, 90, 65], 1.0),
    3: ([60, 87, 70, 97], 0.3),  # bottom edge: y 87-97 -> 114..134
    4: ([113, 50, 123, 60], 0.7),  # right edge: x 113-123 -> 146..166
}
TURN_BOXES = {
    0: ([14, 10, 24, 30], 0.4),  # y' = 140 - x: 116..126, 4 of 10 inside
    1: ([12, 40, 22, 60], 0.2),  # 118..128
    2: ([60, 30, 90, 50], 1.0),
    3: ([134, 60, 144, 80], 0.6),  # -4..6
    4: ([132, 90, 142, 100], 0.8),  # -2..8
}
MAPS = {
    "scale": ([RandomAffine(scale=(2.0, 2.0)), Resize((HEIGHT, WIDTH))], SCALE_BOXES, lambda b: [2 * b[0] - 80, 2 * b[1] - 60, 2 * b[2] - 80, 2 * b[3] - 60]),
    "turn": ([RandomRotation((90, 90)), Resize((HEIGHT, WIDTH))], TURN_BOXES, lambda b: [b[1] + 20, 140 - b[2], b[3] + 20, 140 - b[0]]),
}  # fmt: skip


def _samples(boxes: dict, masks: bool) -> list:
    rng = np.random.default_rng(0)
    out = []
    for k in range(2):  # two samples alike, the second's objects of other classes (5 + class)
        image = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
        target = {
            "boxes": np.array([b for b, _ in boxes.values()], np.float32),
            "classes": np.array(list(boxes)) + 5 * k,
        }
        if masks:
            mask = np.zeros((HEIGHT, WIDTH), np.uint8)
            for c, (b, _) in boxes.items():
                mask[b[1] : b[3], b[0] : b[2]] = c + 1
            target["mask"] = mask
        out.append((image, target))
    return out


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("visibility")
    config = BuildConfig(pipeline="none", workers=1, progress=False, order="sorted", strict=True)
    made = {}
    for name, (_, boxes, _) in MAPS.items():
        for masks in (False, True):
            out = root / f"{name}-{masks}"
            build(_samples(boxes, masks), out, config, classes=10)
            made[name, masks] = out
    return made


@pytest.mark.parametrize("on", ["threads", "device"])
@pytest.mark.parametrize("masks", [False, True], ids=["boxes", "boxes-and-masks"])
@pytest.mark.parametrize("name", list(MAPS))
def test_min_visibility_drops_boxes_that_end_mostly_outside_a_general_map(caches, name, masks, on):
    steps, boxes, move = MAPS[name]
    options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
    assert len(CachedDataset(caches[name, masks])) == 2
    for min_visibility in (0.0, 0.5):
        loader = make_loader(caches[name, masks], 2, shuffle=False, seed=0, augment=steps,
                             min_visibility=min_visibility, threads=2, **options)  # fmt: skip
        (images, targets), *rest = list(loader)
        assert not rest and images.shape[-2:] == (HEIGHT, WIDTH)
        for k, target in enumerate(targets):
            kept = {int(c) - 5 * k: b for c, b in zip(target["classes"], target["boxes"].numpy())}
            want = {c for c, (_, share) in boxes.items() if share >= min_visibility}
            assert set(kept) == want, (name, min_visibility, k, sorted(kept))
            for c, b in kept.items():
                x0, y0, x1, y1 = move(boxes[c][0])
                clipped = [max(x0, 0), max(y0, 0), min(x1, WIDTH), min(y1, HEIGHT)]
                assert np.allclose(b, clipped, atol=1e-3), (c, b, clipped)
                area = (clipped[2] - clipped[0]) * (clipped[3] - clipped[1])
                assert (
                    abs(area / ((x1 - x0) * (y1 - y0)) - boxes[c][1]) < 1e-6
                )  # the share it was meant to keep
            if masks:  # the mask moved with the pixels whatever the boxes kept
                assert set(np.unique(target["mask"].numpy())) == {0, *(c + 1 for c in boxes)}


#: Random general maps: what each drops at 0.5 it keeps, cut by an edge, at 0; the rest is the same.
RANDOM = {
    "perspective then crop": [RandomPerspective(0.6, p=1.0), RandomResizedCrop(80, scale=(0.2, 0.5))],
    "zoom-out then crop": [RandomZoomOut(side_range=(1.0, 2.0), p=1.0), RandomResizedCrop(80, scale=(0.2, 0.5))],
    "iou crop": [RandomIoUCrop(max_scale=0.6, sampler_options=(0.0, 0.1)), Resize((80, 80))],
    "mosaic": [Mosaic(96), RandomAffine(5, translate=(0.1, 0.1), scale=(0.5, 1.5))],
}  # fmt: skip


@pytest.fixture(scope="module")
def objects(tmp_path_factory):
    root = tmp_path_factory.mktemp("objects")
    make_object_dataset(root / "raw", 12, size=(120, 160), classes=3)
    build(
        root / "raw", root / "c", BuildConfig(annotations="yolo", pipeline="none", workers=1, progress=False)
    )
    return root / "c"


@pytest.mark.parametrize("on", ["threads", "device"])
@pytest.mark.parametrize("name", list(RANDOM))
def test_min_visibility_only_drops_boxes_an_edge_cuts_after_every_general_map(objects, name, on):
    options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
    read = {}
    for min_visibility in (0.0, 0.5):
        loader = make_loader(objects, 4, shuffle=False, seed=3, augment=RANDOM[name],
                             min_visibility=min_visibility, **options)  # fmt: skip
        read[min_visibility] = [(tuple(images.shape[-2:]), t) for images, targets in loader for t in targets]
    dropped = 0
    for ((h, w), every), (_, some) in zip(read[0.0], read[0.5]):
        rows = {tuple(b.tolist()) + (int(c),) for b, c in zip(every["boxes"], every["classes"])}
        kept = {tuple(b.tolist()) + (int(c),) for b, c in zip(some["boxes"], some["classes"])}
        assert kept <= rows  # the same boxes, moved alike
        for x0, y0, x1, y1, _ in rows - kept:  # a box it drops was cut by the output's edge
            assert min(x0, y0) <= 1e-3 or x1 >= w - 1e-3 or y1 >= h - 1e-3, (x0, y0, x1, y1)
        dropped += len(rows - kept)
    assert dropped > 0
