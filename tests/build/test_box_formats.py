"""Boxes from code in every format (xyxy, xywh, cxcywh), in pixels or normalised, store the same
xyxy pixel corners: on a non-square image, so that a swapped width and height shows."""

from __future__ import annotations

import numpy as np
import pytest

from cachekit import BuildConfig, CachedDataset, build

HEIGHT, WIDTH = 60, 100
#: The objects, as xyxy pixel corners: wide and tall ones, none centred, none square.
XYXY = np.array([[10, 5, 40, 25], [55, 30, 95, 58], [2, 12, 14, 52]], dtype=np.float64)
QUIET = {"workers": 1, "progress": False, "pipeline": "none", "strict": True, "order": "sorted"}


def _as(fmt: str, normalized: bool) -> np.ndarray:
    x0, y0, x1, y1 = XYXY.T
    boxes = {
        "xyxy": XYXY,
        "xywh": np.stack([x0, y0, x1 - x0, y1 - y0], 1),
        "cxcywh": np.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], 1),
    }[fmt]
    return boxes / [WIDTH, HEIGHT, WIDTH, HEIGHT] if normalized else boxes


def _samples(fmt: str, normalized: bool) -> list:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    target = {"boxes": _as(fmt, normalized).astype(np.float32), "classes": np.array([0, 1, 2])}
    return [
        (image, target),
        (image[:, ::-1].copy(), {"boxes": target["boxes"][:0], "classes": np.zeros(0, int)}),
    ]


@pytest.mark.parametrize("normalized", [False, True], ids=["pixels", "normalized"])
@pytest.mark.parametrize("fmt", ["xyxy", "xywh", "cxcywh"])
def test_every_box_format_stores_the_same_pixel_corners(tmp_path, fmt, normalized):
    build(
        _samples(fmt, normalized),
        tmp_path / "c",
        BuildConfig(**QUIET),
        box_format=fmt,
        normalized=normalized,
        classes=3,
    )
    ds = CachedDataset(tmp_path / "c")
    assert len(ds) == 2
    stored = {tuple(ds[i][0].shape): ds[i][1] for i in range(2)}
    assert set(stored) == {(3, HEIGHT, WIDTH)}  # both images kept their size
    with_boxes = [ds[i][1] for i in range(2) if len(ds[i][1]["boxes"])]
    assert len(with_boxes) == 1
    np.testing.assert_allclose(with_boxes[0]["boxes"].numpy(), XYXY, atol=1e-3)
    assert with_boxes[0]["classes"].tolist() == [0, 1, 2]
