"""``collate="yolo"`` never drops a field without a word: a cache with masks (or any field besides
its boxes) is refused in one line that names the field and the way out."""

from __future__ import annotations

import pytest
import torch

from cachekit import BuildConfig, build, make_loader
from cachekit.tools.synthetic_objects import make_object_dataset
from cachekit.transforms import Letterbox


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


def test_yolo_rows_are_normalised_to_the_output_on_the_device_path_too(caches):
    """The device stage's parameters carry the stored sizes: YOLO rows must still be normalised to
    the augmented output's size, the same rows as the threads give (a resize from 48 to 32 moves
    nothing in normalised terms, so the rows equal the boxes over 32)."""
    rows = {}
    for where in ("threads", "device"):
        loader = make_loader(
            caches / "boxes",
            3,
            shuffle=False,
            collate="yolo",
            augment=[Letterbox(32)],
            device="cpu",
            augment_on=where,
        )
        rows[where] = next(iter(loader))[1]
    assert len(rows["threads"]) and rows["threads"].shape == rows["device"].shape
    assert float((rows["threads"] - rows["device"]).abs().max()) < 1e-4
    boxes = next(iter(make_loader(caches / "boxes", 3, shuffle=False, augment=[Letterbox(32)])))[1]
    first = boxes[0]["boxes"]
    cx = (first[:, 0] + first[:, 2]) / 2 / 32
    assert torch.allclose(rows["device"][rows["device"][:, 0] == 0][:, 2], cx, atol=1e-4)
