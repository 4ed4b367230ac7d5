"""Pixel operations of cachekit.image.ops that other layers lean on."""

from __future__ import annotations

import numpy as np

from cachekit.image.ops import hwc_into_planes


def test_hwc_into_planes_fills_channels_first_views_in_place():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    out = np.zeros((2, 3, 9, 11), np.uint8)
    hwc_into_planes(src, out[1, :, :5, :7])  # strided rows, as a padded batch row is
    assert np.array_equal(out[1, :, :5, :7], src.transpose(2, 0, 1))
    assert not out[0].any() and not out[1, :, 5:].any() and not out[1, :, :, 7:].any()
    gray = rng.integers(0, 256, (5, 7, 1), dtype=np.uint8)
    one = np.zeros((1, 5, 7), np.uint8)
    hwc_into_planes(gray, one)
    assert np.array_equal(one[0], gray[:, :, 0])
