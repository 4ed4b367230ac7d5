"""``collate="yolo"`` never drops a field without a word: a cache with masks (or any field besides
its boxes) is refused in one line that names the field and the way out."""

from __future__ import annotations

import pytest

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
