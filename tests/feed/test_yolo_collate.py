"""``collate="yolo"`` never drops a field without a word: a cache with masks (or any field besides
its boxes) is refused in one line that names the field and the way out."""

from __future__ import annotations

import pytest
import torch

from cachekit import BuildConfig, build, make_loader
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import Letterbox, MixUp, RandomAffine, RandomResizedCrop, Resize


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("yolo-collate")
    raw = make_object_dataset(root / "raw", 6, size=(40, 60), classes=3)
    quiet = {"workers": 1, "progress": False, "pipeline": "letterbox-640", "size": 48, "annotations": "yolo"}
    build(raw, root / "boxes", BuildConfig(**quiet))
    build(raw, root / "masks", BuildConfig(masks=str(raw / "masks"), **quiet))
    return root


def test_yolo_rows_of_a_cache_with_masks_are_refused_naming_them(caches):
    with pytest.raises(ValueError, match=r'only the boxes.*mask \(mask\).*collate="auto"') as err:
        make_loader(caches / "masks", 2, collate="yolo", augment=[Letterbox(32)])
    assert "\n" not in str(err.value)
    images, targets = next(iter(make_loader(caches / "masks", 2, shuffle=False)))  # auto keeps them
    assert isinstance(targets, list) and targets[0]["mask"].shape == images.shape[-2:] == (48, 48)


def test_yolo_rows_of_a_boxes_cache_still_come(caches):
    images, rows = next(iter(make_loader(caches / "boxes", 2, shuffle=False, collate="yolo")))
    assert rows.shape[1] == 6 and len(rows) and set(rows[:, 0].tolist()) <= {0.0, 1.0}


def _xywhn(boxes: torch.Tensor, hw) -> torch.Tensor:
    b, (h, w) = boxes.float(), hw
    return torch.stack(
        [
            (b[:, 0] + b[:, 2]) / 2 / w,
            (b[:, 1] + b[:, 3]) / 2 / h,
            (b[:, 2] - b[:, 0]) / w,
            (b[:, 3] - b[:, 1]) / h,
        ],
        1,
    )


@pytest.mark.parametrize(
    "augment",
    [
        [Resize((40, 40)), MixUp(p=1.0)],
        [RandomAffine(20, scale=(0.5, 1.5)), Resize((40, 40))],
        [RandomResizedCrop(24)],
        [Resize((30, 44))],  # not square: x over the width, y over the height
        [RandomAffine(10, scale=(0.8, 1.2)), Resize((32, 48))],
    ],
)
@pytest.mark.parametrize("on_device", [False, True])
def test_yolo_rows_are_normalised_to_the_augmented_size_on_threads_and_device(caches, augment, on_device):
    """Each row is its sample's box (image index, class, cx, cy, w, h) over the output's size; on the
    device path they were divided by the stored images' size (48 here), not the augmented one."""
    options = {"device": "cpu", "augment_on": "device"} if on_device else {}
    auto = make_loader(caches / "boxes", 3, seed=2, augment=augment, **options)
    yolo = make_loader(caches / "boxes", 3, seed=2, augment=augment, collate="yolo", **options)
    rows_seen = 0
    for (images, targets), (same, rows) in zip(auto, yolo):
        assert torch.equal(images, same)
        for j, target in enumerate(targets):
            mine = rows[rows[:, 0] == j]
            assert torch.equal(mine[:, 1].long(), target["classes"].long())
            assert torch.allclose(mine[:, 2:], _xywhn(target["boxes"], images.shape[-2:]), atol=1e-4)
            rows_seen += len(mine)
    assert rows_seen > 0


@pytest.mark.parametrize("on_device", [False, True])
def test_detection_mixup_of_a_one_sample_batch_keeps_its_boxes_once(caches, on_device):
    options = {"device": "cpu", "augment_on": "device"} if on_device else {}
    plain = make_loader(caches / "boxes", 1, seed=4, augment=[Resize((32, 32))], **options)
    mixed = make_loader(caches / "boxes", 1, seed=4, augment=[Resize((32, 32)), MixUp(p=1.0)], **options)
    boxes = 0
    for (a, ta), (b, tb) in zip(plain, mixed):
        assert torch.equal(a, b) and torch.equal(ta[0]["boxes"], tb[0]["boxes"])
        boxes += len(tb[0]["boxes"])
    assert boxes > 0
