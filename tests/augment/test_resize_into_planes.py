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


def test_a_crop_is_merged_into_this_threads_scratch_sample_after_sample(monkeypatch):
    """The crop's planes are copied and merged into the thread's reused scratch (no fresh arrays a
    sample), and a smaller crop after a larger one, shrinking then enlarging, still gets its own
    pixels: torchvision's (OpenCV's bilinear when enlarging, cachekit's way)."""
    import cachekit.augment.warp as warp
    import cachekit.image.scratch as kept

    merges = []
    real_merge = cv2.merge

    def merge(planes, dst=None):
        merges.append((planes, dst))
        return real_merge(planes, dst)

    monkeypatch.setattr(warp.cv2, "merge", merge)
    chw = _planes(256, 300, 2)
    for (top, left, h, w), size in [((3, 9, 240, 280), (224, 224)), ((50, 60, 100, 120), (224, 224)),
                                    ((0, 0, 256, 300), (96, 128)), ((7, 5, 30, 40), (64, 48))]:  # fmt: skip
        crop = chw[:, top : top + h, left : left + w]
        row = np.zeros((3, *size), np.uint8)
        _resize_array(crop, row)
        if h <= size[0] and w <= size[1]:  # enlarging: OpenCV's bilinear on the crop's pixels
            pixels = cv2.resize(np.ascontiguousarray(crop.transpose(1, 2, 0)), size[::-1])
            assert np.array_equal(row, pixels.transpose(2, 0, 1))
        else:
            assert np.array_equal(row, _torchvision(crop, size))
        planes, dst = merges[-1]
        assert dst.shape == (h, w, 3)
        assert np.shares_memory(dst, getattr(kept._local, "warp.crop_pixels"))
        assert all(np.shares_memory(p, getattr(kept._local, "warp.crop_planes")) for p in planes)
        assert all(np.array_equal(p, c) for p, c in zip(planes, crop))
    assert len(merges) == 4


def _reference(crop: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """cachekit's resize of planes ``crop``: OpenCV's bilinear enlarging, torchvision's shrinking."""
    if crop.shape[1] <= size[0] and crop.shape[2] <= size[1]:
        if crop.shape[0] == 1:
            return cv2.resize(np.ascontiguousarray(crop[0]), size[::-1])[None]
        return cv2.resize(np.ascontiguousarray(crop.transpose(1, 2, 0)), size[::-1]).transpose(2, 0, 1)
    return _torchvision(crop, size)


@pytest.mark.parametrize("box, size", [((50, 60, 100, 120), (224, 224)), ((3, 9, 240, 280), (224, 224)),
                                       ((0, 0, 224, 224), (224, 224))])  # fmt: skip
def test_a_flipped_crop_is_mirrored_as_pixels_before_the_split(monkeypatch, box, size):
    """The flip runs on the resized channels-last pixels (hot, before they are split into the row's
    planes), not on the row's planes after; mirrored the same in every layout and plane count."""
    import cachekit.augment.warp as warp

    flips = []
    real_flip = cv2.flip

    def flip(src, code, dst=None):
        flips.append((src.shape, code))
        return real_flip(src, code, dst=dst)

    monkeypatch.setattr(warp.cv2, "flip", flip)
    chw = _planes(256, 300, 3)
    top, left, h, w = box
    crop = chw[:, top : top + h, left : left + w]
    want = _reference(crop, size)[:, :, ::-1]
    row = np.zeros((3, *size), np.uint8)
    warp.warp_planes(chw, box, True, True, row)
    assert np.array_equal(row, want)
    resized = (h, w) != size
    assert flips == ([((*size, 3), 1)] if resized else [((3 * size[0], size[1]), 1)])
    flips.clear()
    hwc = np.ascontiguousarray(chw.transpose(1, 2, 0))
    row = np.zeros((3, *size), np.uint8)
    warp.warp_hwc(hwc, box, True, True, row)  # pixels stored channels-last
    assert np.array_equal(row, want)
    last = np.zeros((1, *size, 3), np.uint8).transpose(0, 3, 1, 2)  # a channels-last batch's row
    warp.warp_planes(chw, box, True, True, last[0])
    assert np.array_equal(last[0], want)
    gray = np.zeros((1, *size), np.uint8)  # one plane: mirrored after
    warp.warp_planes(chw[:1], box, True, True, gray)
    assert np.array_equal(gray, _reference(crop[:1], size)[:, :, ::-1])
    unflipped = np.zeros((3, *size), np.uint8)
    warp.warp_planes(chw, box, False, True, unflipped)
    assert np.array_equal(unflipped, want[:, :, ::-1])
