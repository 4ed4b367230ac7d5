"""The carrier's movers at their edges (``image.instances``, through ``image.geometry``'s maps):
``min_visibility`` on every box path, masks warped nearest."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from cachekit.image.geometry import Affine
from cachekit.image.instances import Instances, from_pixel_indices, move_mask

#: A 40x40 image cropped to its columns 8..32 (CenterCrop(24) without rows cut): the first box
#: keeps 0.4 of its 8.4 px width (4.8% of its area), the second all of it.
CROP = Affine.crop(0, 8, 40, 24, (40, 24))
BOXES = np.array([[0.0, 10.0, 8.4, 30.0], [12.0, 10.0, 20.0, 30.0]], dtype=np.float32)
SHIFT = np.array([[1.0, 0.0, -8.0], [0.0, 1.0, 0.0]])  # the same crop as a 2x3 map of pixel indices


def _objects() -> Instances:
    return Instances(BOXES, np.array([3, 4]), np.zeros(2, np.uint8), np.zeros(2, np.int64))


def _per_sample(visibility):
    return _objects().through(CROP.as_matrix(), (40, 24), visibility).classes.tolist()


def _matrix(visibility):
    return _objects().through(from_pixel_indices(SHIFT), (40, 24), visibility).classes.tolist()


@pytest.mark.parametrize("path", [_per_sample, _matrix])
def test_a_box_keeping_5_percent_is_dropped_at_0_1_and_kept_at_0(path):
    both = [3, 4]
    assert path(0.1) == [4]
    assert path(0.0) == both
    assert path(0.04) == both and path(0.06) == [4]  # the line is at 4.8%


def _classes_0_and_2(size: int = 64) -> np.ndarray:
    """A class map of 0 and 2 only, with many edges (a blend of the two would be 1)."""
    rng = np.random.default_rng(0)
    return (
        cv2.resize(rng.integers(0, 2, (8, 8), dtype=np.uint8), (size, size), interpolation=cv2.INTER_NEAREST)
    ) * 2


@pytest.mark.parametrize("angle", [7.0, 33.0, 45.0, 90.5])
def test_a_rotated_mask_of_classes_0_and_2_never_gains_a_value(angle):
    mask = _classes_0_and_2()
    matrix = cv2.getRotationMatrix2D((31.5, 31.5), angle, 1.3)
    out = move_mask(mask, from_pixel_indices(matrix), (64, 64))
    assert set(np.unique(out).tolist()) == {0, 2}


@pytest.mark.parametrize("scale", [0.37, 1.0, 2.6])
def test_a_scaled_mask_of_classes_0_and_2_never_gains_a_value(scale):
    mask = _classes_0_and_2()
    out = move_mask(mask, Affine(scale, scale * 0.9, 3.3, -2.1), (50, 70))
    assert set(np.unique(out).tolist()) <= {0, 2} and 2 in out


@pytest.fixture(scope="module")
def one_box_cache(tmp_path_factory):
    """A 40x40 image with a box over columns 0..8.4 and one over 12..20; built with and without masks."""
    from cachekit import BuildConfig, build

    raw = tmp_path_factory.mktemp("visibility") / "raw"
    for folder in ("images", "labels", "masks/images"):
        (raw / folder).mkdir(parents=True)
    cv2.imwrite(
        str(raw / "images" / "a.png"), np.random.default_rng(1).integers(0, 255, (40, 40, 3), np.uint8)
    )
    (raw / "labels" / "a.txt").write_text("0 0.105 0.5 0.21 0.5\n1 0.4 0.5 0.2 0.5\n")
    (raw / "data.yaml").write_text("names: [a, b]\n")
    cv2.imwrite(str(raw / "masks" / "images" / "a.png"), _classes_0_and_2(40))
    quiet = {"workers": 1, "progress": False, "pipeline": "none", "annotations": "yolo"}
    build(raw, raw.parent / "boxes", BuildConfig(**quiet))
    build(raw, raw.parent / "masks", BuildConfig(masks=str(raw / "masks"), **quiet))
    return raw.parent


@pytest.mark.parametrize("kind", ["boxes", "masks"])
def test_a_loaders_crop_drops_the_box_keeping_5_percent_at_0_1_only(one_box_cache, kind):
    from cachekit import make_loader
    from cachekit.transforms import CenterCrop

    def classes(visibility):
        loader = make_loader(
            one_box_cache / kind, 1, augment=[CenterCrop((40, 24))], min_visibility=visibility
        )
        ((_, (target,)),) = list(loader)
        return target["classes"].tolist()

    assert classes(0.1) == [1] and sorted(classes(0.0)) == [0, 1]
