"""Pixel kernels of the per-sample stage against numpy/torch references written from torchvision's and
Ultralytics' definitions, and the batched torch kernels against the per-row OpenCV ones."""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cachekit.augment import pixelbatch, pixelkernels
from cachekit.augment.autoaugment import op_matrix
from cachekit.image.instances import Instances, from_pixel_indices
from cachekit.tools.synthetic import synthetic_image


def _row(seed: int = 0, h: int = 40, w: int = 56) -> np.ndarray:
    return np.ascontiguousarray(synthetic_image(np.random.default_rng(seed), h, w).transpose(2, 0, 1))


def _close(got: np.ndarray, want: np.ndarray, levels: int = 1) -> None:
    diff = np.abs(got.astype(np.int64) - np.asarray(want).astype(np.int64))
    assert diff.max() <= levels, f"differs by up to {diff.max()} levels"


def test_posterize_solarize_invert_are_torchvisions_exactly():
    x = _row()
    for bits in range(9):
        y = x.copy()
        pixelkernels.posterize(y, bits)
        mask = ((1 << bits) - 1) << (8 - bits) if bits < 8 else 255
        assert np.array_equal(y, x & mask)
    for threshold in (0.0, 1.5, 128.0, 255.0 * 0.7, 255.0):
        y = x.copy()
        pixelkernels.solarize(y, threshold)
        assert np.array_equal(y, np.where(x >= threshold, 255 - x, x))
    y = x.copy()
    pixelkernels.invert(y)
    assert np.array_equal(y, 255 - x)


def _pil_equalize(plane: np.ndarray) -> np.ndarray:
    """PIL's ImageOps.equalize, as written there: a loop over the histogram."""
    h = np.bincount(plane.ravel(), minlength=256).tolist()
    nonzero = [v for v in h if v]
    step = (sum(nonzero) - nonzero[-1]) // 255
    if not step:
        return plane.copy()
    lut, n = [], step // 2
    for i in range(256):
        lut.append(min(255, n // step))
        n += h[i]
    return np.array(lut, dtype=np.uint8)[plane]


def test_equalize_is_pils_per_channel():
    for seed in range(3):
        x = _row(seed)
        x[1] //= 4  # a narrow histogram
        y = x.copy()
        pixelkernels.equalize(y)
        for c in range(3):
            assert np.array_equal(y[c], _pil_equalize(x[c]))
    flat = np.full((3, 8, 8), 77, np.uint8)  # one value: step 0, unchanged
    pixelkernels.equalize(flat)
    assert (flat == 77).all()


def test_autocontrast_stretches_each_channel_as_torchvision():
    x = (_row() // 2 + 40).astype(np.uint8)
    x[2] = 9  # a constant channel stays as it is
    y = x.copy()
    pixelkernels.autocontrast(y)
    for c in range(2):
        lo, hi = np.float32(x[c].min()), np.float32(x[c].max())
        want = np.clip((x[c].astype(np.float32) - lo) / ((hi - lo) * np.float32(1 / 255)), 0, 255).astype(
            np.uint8
        )
        assert np.array_equal(y[c], want)
        assert y[c].min() == 0 and y[c].max() >= 254  # float32 truncation, as torchvision
    assert (y[2] == 9).all()


@pytest.mark.parametrize("factor", [0.1, 0.73, 1.0, 1.9])
def test_blends_match_their_definitions(factor):
    x = _row(3)
    xf = x.astype(np.float64)
    gray = 0.299 * xf[0] + 0.587 * xf[1] + 0.114 * xf[2]
    y = x.copy()
    pixelkernels.brightness(y, factor)
    _close(y, np.clip(np.round(xf * factor), 0, 255))
    y = x.copy()
    pixelkernels.color(y, factor)
    _close(y, np.clip(np.round(factor * xf + (1 - factor) * np.round(gray)[None]), 0, 255))
    y = x.copy()
    pixelkernels.contrast(y, factor)
    _close(y, np.clip(np.round(factor * xf + (1 - factor) * gray.mean()), 0, 255))
    y = x.copy()
    pixelkernels.sharpness(y, factor)
    kernel = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13.0
    want = xf.copy()
    h, w = x.shape[1:]
    smooth = sum(kernel[a, b] * xf[:, a : h - 2 + a, b : w - 2 + b] for a in range(3) for b in range(3))
    want[:, 1:-1, 1:-1] = np.clip(
        np.round(factor * xf[:, 1:-1, 1:-1] + (1 - factor) * np.round(smooth)), 0, 255
    )
    _close(y, want)
    assert np.array_equal(y[:, 0], x[:, 0]) and np.array_equal(y[:, :, -1], x[:, :, -1])  # borders kept


def test_grayscale_is_torchvisions_weights_truncated():
    x = _row(4)
    y = x.copy()
    pixelkernels.grayscale(y)
    xf = x.astype(np.float64)
    want = np.floor(0.2989 * xf[0] + 0.587 * xf[1] + 0.114 * xf[2])
    _close(y[0], want)
    assert np.array_equal(y[0], y[1]) and np.array_equal(y[1], y[2])


def _tv_inverse(center, angle, translate, scale, shear) -> list[float]:
    """torchvision's ``_get_inverse_affine_matrix`` (centred coordinates)."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    cx, cy = center
    tx, ty = translate
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [x / scale for x in (d, -b, 0.0, -c, a, 0.0)]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def _tv_affine(chw: np.ndarray, name: str, magnitude: float) -> np.ndarray:
    """torchvision's ``F.affine`` / ``F.rotate`` on a uint8 tensor, nearest, fill 0, as its autoaugment
    ops call them: ``_affine_grid`` then ``grid_sample``."""
    c, h, w = chw.shape
    corner = [-w * 0.5, -h * 0.5]  # center=[0, 0], in its centred coordinates
    if name == "ShearX":
        m = _tv_inverse(corner, 0.0, [0, 0], 1.0, [math.degrees(math.atan(magnitude)), 0.0])
    elif name == "ShearY":
        m = _tv_inverse(corner, 0.0, [0, 0], 1.0, [0.0, math.degrees(math.atan(magnitude))])
    elif name == "TranslateX":
        m = _tv_inverse([0.0, 0.0], 0.0, [int(magnitude), 0], 1.0, [0.0, 0.0])
    elif name == "TranslateY":
        m = _tv_inverse([0.0, 0.0], 0.0, [0, int(magnitude)], 1.0, [0.0, 0.0])
    else:
        m = _tv_inverse([0.0, 0.0], -magnitude, [0.0, 0.0], 1.0, [0.0, 0.0])
    theta = torch.tensor(m, dtype=torch.float64).reshape(1, 2, 3)
    base = torch.ones(1, h, w, 3, dtype=torch.float64)
    base[..., 0] = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w)
    base[..., 1] = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h)[:, None]
    grid = base.view(1, h * w, 3).bmm(
        theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=torch.float64)
    )
    img = torch.from_numpy(chw).double()[None]
    img = torch.cat([img, torch.ones(1, 1, h, w, dtype=torch.float64)], dim=1)  # torchvision's fill mask
    out = F.grid_sample(img, grid.view(1, h, w, 2), mode="nearest", align_corners=False)[0]
    return torch.where(out[-1:] < 0.5, torch.zeros_like(out[:-1]), out[:-1]).numpy().astype(np.uint8)


@pytest.mark.parametrize(
    "name,magnitude",
    [("ShearX", 0.27), ("ShearX", -0.99), ("ShearY", 0.3), ("ShearY", -0.13), ("TranslateX", 17.9),
     ("TranslateX", -32.0), ("TranslateY", 12.2), ("Rotate", 9.0), ("Rotate", -30.0), ("Rotate", 135.0)],
)  # fmt: skip
def test_geometric_ops_place_pixels_as_torchvision(name, magnitude):
    x = _row(5, 48, 64)
    y = x.copy()
    pixelkernels.affine(y, op_matrix(name, magnitude, 48, 64), (0,))
    want = _tv_affine(x, name, magnitude)
    # a source point exactly between two pixels may take either: at multiples of 45 degrees many do
    ties = name == "Rotate" and magnitude % 45 == 0
    assert (y != want).any(axis=0).mean() < (0.03 if ties else 0.01)
    assert not np.array_equal(y, x)


def test_geometric_ops_move_boxes_with_their_pixels():
    for name, magnitude in (("ShearX", 0.3), ("ShearY", -0.3), ("TranslateX", -9.0), ("Rotate", 25.0)):
        chw = np.zeros((3, 60, 80), np.uint8)
        chw[:, 20:36, 30:50] = 255
        m = op_matrix(name, magnitude, 60, 80)
        pixelkernels.affine(chw, m, (0,))
        ys, xs = np.nonzero(chw[0])
        region = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)
        box = Instances(np.array([[30.0, 20.0, 50.0, 36.0]]), np.zeros(1), np.zeros(1), np.zeros(1, np.int64))
        moved = box.through(from_pixel_indices(m), (60, 80), 0.0).boxes[0]
        assert np.abs(moved - region).max() <= 1.0, (name, moved, region)


def _tv_kernel(size: int, sigma: float) -> torch.Tensor:
    lim = (size - 1) / (2.0 * math.sqrt(2.0) * sigma)
    x = torch.linspace(-lim, lim, size, dtype=torch.float64).pow(2)
    return torch.softmax(-x, dim=0)


@pytest.mark.parametrize("sizes,sigma", [((5, 5), 1.3), ((3, 7), 0.4), ((9, 3), 2.0)])
def test_gaussian_blur_is_torchvisions(sizes, sigma):
    x = _row(6)
    y = x.copy()
    pixelkernels.gaussian_blur(y, sizes, sigma)
    kx, ky = sizes
    kernel = (_tv_kernel(ky, sigma)[:, None] * _tv_kernel(kx, sigma)[None, :]).expand(3, 1, ky, kx)
    padded = F.pad(torch.from_numpy(x).double()[None], [kx // 2, kx // 2, ky // 2, ky // 2], mode="reflect")
    want = F.conv2d(padded, kernel, groups=3)[0].round().numpy()
    _close(y, want)


def _ultralytics_hsv(rgb_chw: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Ultralytics' RandomHSV (8.3.79+), on a BGR image as it reads them."""
    img = np.ascontiguousarray(rgb_chw.transpose(1, 2, 0)[..., ::-1])
    x = np.arange(0, 256, dtype=r.dtype)
    lut_hue = ((x + r[0] * 180) % 180).astype(np.uint8)
    lut_sat = np.clip(x * (r[1] + 1), 0, 255).astype(np.uint8)
    lut_val = np.clip(x * (r[2] + 1), 0, 255).astype(np.uint8)
    lut_sat[0] = 0
    hue, sat, val = cv2.split(cv2.cvtColor(img, cv2.COLOR_BGR2HSV))
    im_hsv = cv2.merge((cv2.LUT(hue, lut_hue), cv2.LUT(sat, lut_sat), cv2.LUT(val, lut_val)))
    return cv2.cvtColor(im_hsv, cv2.COLOR_HSV2BGR)[..., ::-1].transpose(2, 0, 1)


def test_hsv_is_ultralytics():
    x = _row(7)
    for r in (np.array([0.015, -0.7, 0.4]), np.array([-0.01, 0.3, -0.4]), np.zeros(3)):
        y = x.copy()
        pixelkernels.hsv(y, r)
        assert np.array_equal(y, _ultralytics_hsv(x, r))


def test_torch_kernels_match_the_row_kernels():
    """Every batched kernel against its per-row counterpart, several parameters per batch."""
    rows = np.stack([_row(s) for s in range(4)])
    x = torch.from_numpy(rows).float()
    f = np.array([0.1, 0.6, 1.0, 1.8])

    def each(fn, *params):
        out = rows.copy()
        for j in range(len(out)):
            fn(out[j], *(p[j] for p in params))
        return out

    cases = {
        "brightness": (pixelbatch.brightness(x, torch.from_numpy(f)), each(pixelkernels.brightness, f)),
        "color": (pixelbatch.color(x, torch.from_numpy(f)), each(pixelkernels.color, f)),
        "contrast": (pixelbatch.contrast(x, torch.from_numpy(f)), each(pixelkernels.contrast, f)),
        "sharpness": (pixelbatch.sharpness(x, torch.from_numpy(f)), each(pixelkernels.sharpness, f)),
        "posterize": (
            pixelbatch.posterize(x, torch.tensor([1, 4, 7, 8])),
            each(pixelkernels.posterize, [1, 4, 7, 8]),
        ),
        "solarize": (
            pixelbatch.solarize(x, torch.tensor([0.0, 76.5, 178.5, 255.0], dtype=torch.float64)),
            each(pixelkernels.solarize, [0.0, 76.5, 178.5, 255.0]),
        ),
        "autocontrast": (pixelbatch.autocontrast(x), each(pixelkernels.autocontrast)),
        "equalize": (pixelbatch.equalize(x), each(pixelkernels.equalize)),
        "invert": (pixelbatch.invert(x), each(pixelkernels.invert)),
        "grayscale": (pixelbatch.grayscale(x), each(pixelkernels.grayscale)),
        "blur": (
            pixelbatch.gaussian_blur(x, (5, 3), torch.tensor([0.3, 1.0, 2.0, 4.0])),
            each(lambda r, s: pixelkernels.gaussian_blur(r, (5, 3), s), [0.3, 1.0, 2.0, 4.0]),
        ),
        "hsv": (
            pixelbatch.hsv(x, np.array([[0.01, 0.5, -0.3], [-0.015, -0.7, 0.4], [0, 0, 0], [0.5, 0.2, 0.1]])),
            each(
                pixelkernels.hsv,
                np.array([[0.01, 0.5, -0.3], [-0.015, -0.7, 0.4], [0, 0, 0], [0.5, 0.2, 0.1]]),
            ),
        ),
    }
    for name, (batched, rowwise) in cases.items():
        diff = np.abs(batched.numpy() - rowwise.astype(np.float64))
        assert diff.max() <= 1, f"{name}: the torch kernel differs by {diff.max()} levels"
        assert (diff > 0).mean() < 0.02, f"{name}: {(diff > 0).mean():.1%} of values differ"
    matrices = [
        op_matrix(n, m, 40, 56)
        for n, m in (("Rotate", 20.0), ("ShearX", 0.3), ("TranslateY", -8), ("Rotate", -135))
    ]
    batched = pixelbatch.affine(
        x, torch.from_numpy(np.stack([cv2.invertAffineTransform(m) for m in matrices])), (7,)
    )
    rowwise = rows.copy()
    for j, m in enumerate(matrices):
        pixelkernels.affine(rowwise[j], m, (7,))
    assert (batched.numpy() != rowwise).mean() < 0.005


@pytest.mark.parametrize("shape", [(1, 127), (3, 40), (2, 64), (5, 33), (7, 200)])
def test_the_torch_hsv_round_trip_ends_as_the_installed_opencvs(shape):
    # OpenCV 4 rounds 8-bit HSV -> RGB; OpenCV 5 truncates in its vector loop and rounds each row's
    # tail: the device path must end each value as the OpenCV of the CPU path does
    rng = np.random.default_rng(sum(shape))
    hsv = np.stack(
        [rng.integers(0, 180, shape), rng.integers(0, 256, shape), rng.integers(0, 256, shape)], -1
    )
    hsv = hsv.astype(np.uint8)
    want = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB).transpose(2, 0, 1)
    planes = [torch.from_numpy(hsv[None, ..., k].astype(np.int64)) for k in range(3)]
    got = pixelbatch._hsv8_to_rgb(*planes)[0].numpy()
    # float32 products may differ in their last bit (fused multiply-adds): a value in 1,000 at most
    assert np.abs(got - want).max() <= 1 and (got != want).mean() < 1e-3
