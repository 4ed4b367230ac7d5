"""Boxes and masks stay on their objects through rotations, affine and perspective maps, zoom-outs, IoU
crops and mosaics, on CPU threads and on the device path.

The objects are flat-coloured rectangles (one hue per class) on grey: after every transform, every
visible coloured region not cut by the image's edge has a box of its class with IoU >= 0.8 (the box
round a turned rectangle's corners is the box round its pixels), a region the edge cuts lies in a box
of its class, no box sits on nothing, masks agree with the colours on >= 98% of interior pixels,
and masks hold no value the stored masks do not (nearest, never a blend).
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from test_alignment import CLASSES, MIN_SIDE, _classes_of, _inside, _iou

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.augment.plan import compile_plan
from cachekit.feed.assemble import BatchRequest
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import (
    Mosaic,
    RandomAffine,
    RandomHorizontalFlip,
    RandomIoUCrop,
    RandomPerspective,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    RandomZoomOut,
    Resize,
)


def _build(raw, out, **options):
    config = dict(annotations="yolo", masks=str(raw / "masks"), workers=1, progress=False, min_visibility=0.0)
    build(raw, out, BuildConfig(**(config | options)))
    return out


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("geometric")
    raw = make_object_dataset(tmp / "raw", 12, size=(120, 160), classes=CLASSES)
    two = make_object_dataset(tmp / "two", 8, size=(90, 120), classes=1, seed=3)
    for path in (two / "masks" / "images").iterdir():  # mask classes {0, 2}: a blend would make 1
        mask = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(path), np.where(mask > 0, 2, 0).astype(np.uint8))
    return {
        "none": _build(raw, tmp / "none", pipeline="none"),
        "letterbox": _build(raw, tmp / "lb", pipeline="letterbox-640", size=128),
        "two": _build(two, tmp / "two-c", pipeline="none"),
        "boxes": _build(raw, tmp / "boxes", pipeline="none", masks=None),
    }


#: Each list ends in a fixed size (the stored images' sizes vary).
TRANSFORMS = {
    "rotation": [RandomRotation(15), Resize((96, 128))],
    "rotation expand": [RandomRotation((-15, 15), expand=True), Resize((96, 96))],
    "affine": [RandomAffine(10, translate=(0.1, 0.1), scale=(0.7, 1.3), shear=8), Resize((96, 128))],
    "affine perspective": [RandomAffine(5, scale=(0.8, 1.2), perspective=0.0005), Resize((96, 128))],
    "perspective": [RandomPerspective(0.4, p=1.0), Resize((96, 128)), RandomHorizontalFlip()],
    "zoom-out": [RandomZoomOut(side_range=(1.0, 2.5), p=1.0), Resize((80, 80)), RandomVerticalFlip()],
    "iou crop": [RandomIoUCrop(), Resize((80, 80)), RandomHorizontalFlip()],
    "mosaic": [Mosaic(96), RandomAffine(5, translate=(0.1, 0.1), scale=(0.5, 1.5))],
    "mosaic half": [Mosaic(96, p=0.5), RandomAffine(scale=(0.6, 1.4)), RandomHorizontalFlip()],
    "crop then turn": [RandomResizedCrop(64, scale=(0.3, 1.0)), RandomRotation(10)],
}


def _check(image_chw: np.ndarray, target: dict, what: str, values=None, edge: int = 2, centres=False) -> None:
    """``centres``: an IoU crop drops the boxes whose centres it leaves out (torchvision's rule), so a
    region the edge cuts may have none."""
    pixels = _classes_of(image_chw.transpose(1, 2, 0))
    height, width = pixels.shape
    boxes, classes = target["boxes"].numpy(), target["classes"].numpy()
    assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= width).all() and (boxes[:, 3] <= height).all(), what
    for c in range(CLASSES):  # every visible region has a box of its class
        _, _, stats, _ = cv2.connectedComponentsWithStats((pixels == c).astype(np.uint8), connectivity=4)
        for x, y, w, h, _area in stats[1:]:
            if w < MIN_SIDE or h < MIN_SIDE:
                continue
            region = (x, y, x + w, y + h)
            mine = [b for b, k in zip(boxes, classes) if k == c]
            if x <= 1 or y <= 1 or x + w >= width - 1 or y + h >= height - 1:  # cut by the edge
                best = max((_inside(region, b + [-1.5, -1.5, 1.5, 1.5]) for b in mine), default=0.0)
                assert best >= 0.9 or (centres and best == 0.0), (
                    f"{what}: a cut class-{c} region at {region} is in no box ({best:.2f})"
                )
            else:
                best = max((_iou(region, b) for b in mine), default=0.0)
                assert best >= 0.8, f"{what}: a class-{c} region at {region} has no box (best IoU {best:.2f})"
    for b, k in zip(boxes, classes):  # no box sits on nothing
        x1, y1, x2, y2 = (int(round(v)) for v in b)
        if x2 - x1 < MIN_SIDE or y2 - y1 < MIN_SIDE:
            continue
        share = float((pixels[y1:y2, x1:x2] == k).mean())
        cut = x1 <= 1 or y1 <= 1 or x2 >= width - 1 or y2 >= height - 1  # a turned object's cut box: less
        assert share >= (0.1 if cut else 0.4), (
            f"{what}: box {b.tolist()} of class {k} covers its colour on {share:.0%}"
        )
    if "mask" in target:
        mask = target["mask"].numpy().astype(np.int64)
        if values is not None:
            assert set(np.unique(mask).tolist()) <= values, f"{what}: new mask values {np.unique(mask)}"
            return
        mask = mask - 1
        kernel = np.ones((2 * edge + 1, 2 * edge + 1), np.uint8)
        interior = np.zeros(mask.shape, dtype=bool)
        for c in range(-1, CLASSES):
            interior |= cv2.erode((mask == c).astype(np.uint8), kernel).astype(bool)
        if interior.sum() < 50:
            return
        agree = float((mask[interior] == pixels[interior]).mean())
        assert agree >= 0.98, f"{what}: mask agrees with the colours on {agree:.1%} of interior pixels"


def _run(caches, cache: str, transforms: str, on: str, epochs: int = 2, values=None) -> int:
    options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
    seed = sorted(TRANSFORMS).index(transforms)
    loader = make_loader(CachedDataset(caches[cache]), 4, seed=seed, augment=TRANSFORMS[transforms],
                         min_visibility=0.0, threads=2, **options)  # fmt: skip
    seen = boxes = 0
    for epoch in range(epochs):
        for images, targets in loader:
            for j, target in enumerate(targets):
                what = f"{cache}/{transforms}/{on} epoch {epoch} #{j}"
                _check(images[j].numpy(), target, what, values, centres=transforms == "iou crop")
                seen, boxes = seen + 1, boxes + len(target["boxes"])
    assert seen == epochs * len(loader.dataset) and boxes > seen  # there were boxes to follow
    return seen


@pytest.mark.parametrize("transforms", ["affine", "mosaic", "iou crop"])
def test_boxes_and_masks_follow_general_maps(caches, transforms):
    _run(caches, "none", transforms, "threads", epochs=1)


@pytest.mark.slow
@pytest.mark.parametrize("on", ["threads", "device"])
@pytest.mark.parametrize("transforms", list(TRANSFORMS))
@pytest.mark.parametrize("cache", ["none", "letterbox"])
def test_boxes_and_masks_follow_every_geometric_transform(caches, cache, transforms, on):
    _run(caches, cache, transforms, on)


@pytest.mark.parametrize("on", ["threads", "device"])
@pytest.mark.parametrize("transforms", ["rotation", "perspective", "mosaic", "zoom-out"])
def test_masks_take_no_new_values(caches, transforms, on):
    """Stored classes {0, 2}: nearest sampling keeps them; any blend (bilinear, antialiasing) makes 1."""
    seed = sorted(TRANSFORMS).index(transforms)
    options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
    loader = make_loader(CachedDataset(caches["two"]), 4, seed=seed, augment=TRANSFORMS[transforms],
                         min_visibility=0.0, **options)  # fmt: skip
    found = set()
    for _, targets in loader:
        for target in targets:
            found |= set(np.unique(target["mask"].numpy()).tolist())
    assert found == {0, 2}


def _batch(ds, indices, plan, epoch: int, threads: int, on_device: bool = False):
    request = BatchRequest(indices, epoch=epoch, seed=11, plan=plan, threads=threads, on_device=on_device)
    return ds.read_request(request)


@pytest.mark.parametrize("transforms", ["mosaic half", "iou crop", "perspective"])
def test_same_seed_same_batch_whatever_the_threads_and_a_new_epoch_new_draws(caches, transforms):
    ds = CachedDataset(caches["none"])
    plan = compile_plan(TRANSFORMS[transforms], min_visibility=0.0)
    indices = [3, 0, 7, 11, 5, 2, 9, 1, 4, 10]
    one, three = _batch(ds, indices, plan, 2, 1), _batch(ds, indices, plan, 2, 3)
    assert torch.equal(one.images, three.images)
    for a, b in zip(one.targets, three.targets):
        assert all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)
    alone = _batch(ds, indices[4:6], plan, 2, 1)  # another batch holding the same samples: same draws
    assert torch.equal(alone.images, one.images[4:6])
    later = _batch(ds, indices, plan, 3, 3)
    assert not torch.equal(later.images, one.images)
    device = _batch(ds, indices, plan, 2, 2, on_device=True)  # the same maps travel to the device
    for a, b in zip(one.targets, device.targets):
        assert torch.equal(a["boxes"], b["boxes"]) and torch.equal(
            torch.as_tensor(a["mask"]), torch.as_tensor(b["mask"])
        )


def test_a_mosaic_reads_the_same_in_a_worker_process(caches):
    augment = TRANSFORMS["mosaic"]
    inside = make_loader(caches["none"], 4, seed=5, augment=augment, shuffle=False, workers=0, threads=1)
    worker = make_loader(caches["none"], 4, seed=5, augment=augment, shuffle=False, workers=1)
    (a, ta), (b, tb) = next(iter(inside)), next(iter(worker))
    assert torch.equal(a, b) and all(torch.equal(x["boxes"], y["boxes"]) for x, y in zip(ta, tb))


def test_an_iou_crop_of_a_cache_without_boxes_is_refused_in_one_line(small_cache):
    # refused when the loader is made or the list set, not at the first batch (in a worker process)
    with pytest.raises(ValueError, match="RandomIoUCrop needs a cache with boxes") as info:
        make_loader(small_cache, 4, augment=[RandomIoUCrop(), Resize((16, 16))])
    assert "\n" not in str(info.value)
    loader = make_loader(small_cache, 4, augment=[Resize((16, 16))])
    with pytest.raises(ValueError, match="RandomIoUCrop needs a cache with boxes"):
        loader.set_augment([RandomIoUCrop(), Resize((16, 16))])


@pytest.mark.parametrize("on_device", [False, True])
def test_an_empty_batch_of_a_variable_sized_cache_with_masks_reads(caches, on_device):
    ds = CachedDataset(caches["none"])
    for transforms in ("mosaic", "iou crop", "rotation"):
        plan = compile_plan(TRANSFORMS[transforms])
        batch = _batch(ds, [], plan, 0, 2, on_device)
        assert len(batch.images) == 0 and list(batch.targets) == []


@pytest.mark.parametrize("transforms", ["mosaic", "mosaic far", "affine"])
def test_the_device_path_gives_the_threads_pixels(caches, transforms):
    """The same maps, windows of mosaics and pre-resizes on both paths: within a level or two."""
    steps = TRANSFORMS.get(transforms) or [Mosaic(64), RandomAffine(10, scale=(0.2, 0.45), fill=114)]
    made = {}
    for on in ("threads", "device"):
        options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
        loader = make_loader(caches["none"], 6, seed=4, augment=steps, shuffle=False, **options)
        made[on] = torch.cat([images for images, _ in loader]).float()
    diff = (made["threads"] - made["device"]).abs()
    assert diff.mean() <= 1.0 and diff.max() <= 24, (diff.mean(), diff.max())


@pytest.mark.parametrize("on", ["threads", "device"])
@pytest.mark.parametrize("transforms", ["iou crop", "mosaic"])
def test_a_cache_with_masks_and_one_without_give_the_same_boxes(caches, transforms, on):
    """The same images and boxes with masks and without: boxes read with the masks (sample by
    sample) or alone (the batch's at once, an IoU crop's before the draws) draw the same crops and
    mosaics, and land in the same places."""
    options = {"device": "cpu", "augment_on": "device"} if on == "device" else {"augment_on": "threads"}
    read = {}
    for cache in ("none", "boxes"):
        loader = make_loader(caches[cache], 4, seed=7, augment=TRANSFORMS[transforms], min_visibility=0.3,
                             shuffle=False, **options)  # fmt: skip
        read[cache] = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            read[cache] += list(loader)
    boxes = 0
    for (a, ta), (b, tb) in zip(read["none"], read["boxes"]):
        assert torch.equal(a, b)
        for x, y in zip(ta, tb):
            assert "mask" in x and "mask" not in y
            assert torch.equal(x["boxes"], y["boxes"]) and torch.equal(x["classes"], y["classes"])
            boxes += len(x["boxes"])
    assert len(read["none"]) == len(read["boxes"]) > 0 and boxes > 0
