"""A shrinking crop resized by torch's antialiased kernel reaches the batch's planes through OpenCV's
split (torch hands back channels-last pixels: numpy's transposing copy into cold batch rows cost
about as much as the resize), with torchvision's very pixels."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import cachekit.image.ops as ops
from cachekit.augment.warp import _resize_array
from cachekit.tools.synthetic import synthetic_image


def _planes(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.ascontiguousarray(synthetic_image(np.random.default_rng(seed), h, w).transpose(2, 0, 1))


def _torchvision(crop: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    x = torch.from_numpy(np.ascontiguousarray(crop))[None]
    return F.interpolate(x, size=size, mode="bilinear", antialias=True)[0].numpy()


@pytest.mark.parametrize("box, size", [((10, 20, 200, 250), (112, 112)), ((0, 0, 256, 300), (100, 140)),
                                       ((5, 7, 120, 90), (60, 30))])  # fmt: skip
def test_a_shrinking_crop_is_split_into_the_planes_by_opencv(monkeypatch, box, size):
    chw = _planes(256, 300)
    top, left, h, w = box
    crop = chw[:, top : top + h, left : left + w]
    splits = []
    real_split = cv2.split

    def split(src, dst=None):
        splits.append(src.shape)
        return real_split(src, dst)

    monkeypatch.setattr(ops.cv2, "split", split)
    batch = np.zeros((2, 3, *size), np.uint8)
    _resize_array(crop, batch[1])
    assert splits == [(*size, 3)]
    assert np.array_equal(batch[1], _torchvision(crop, size))
    assert not batch[0].any()  # the neighbouring row untouched


def test_a_window_of_a_row_and_one_plane_still_get_the_resize():
    chw = _planes(200, 240, 1)
    crop = chw[:, 20:180, 30:230]
    row = np.zeros((3, 90, 90), np.uint8)
    _resize_array(crop, row[:, 5:85, 10:80])  # strided rows: the window a partly outside crop fills
    assert np.array_equal(row[:, 5:85, 10:80], _torchvision(crop, (80, 70)))
    assert not row[:, :5].any() and not row[:, :, :10].any()
    gray = chw[:1, 20:180, 30:230]
    out = np.zeros((1, 80, 70), np.uint8)
    _resize_array(gray, out)
    assert np.array_equal(out, _torchvision(gray, (80, 70)))
