"""Pixels through one 3x3 map per sample: OpenCV's warp per sample on CPU threads, ``grid_sample``
batched on a device; the same map, the same conventions, the same antialiasing.

A map takes continuous source coordinates (pixel ``i`` covers ``[i, i+1)``) to output ones. OpenCV
works on pixel indices (centres at integers), so it is given ``T(-1/2) M T(1/2)``, inverted
(``WARP_INVERSE_MAP``); ``grid_sample`` with ``align_corners=False`` reads the same continuous
coordinates scaled to [-1, 1]. Both sample bilinearly, and both take ``fill`` outside the source
(blended over the last pixel's width at its edges, as OpenCV's constant border is): on the device
the batch is shifted by ``fill``, padding beyond each sample's own size zeroed, and shifted back.

Shrinking: bilinear sampling alone aliases when a map shrinks a lot, so a source whose map shrinks
a side by more than 2x (at the source point the output's centre comes from) is first resized to
the output's scale, antialiased as torchvision resizes (``shrink`` sizes, drawn with the map), and
warped from there at about 1:1. Milder shrinks (Ultralytics' scale of 0.5-1.5, small turns) are
warped directly, as Ultralytics and Albumentations warp: a pre-resize of a mosaic's 2x canvas
would cost more than the rest of the sample (measured: 9.5 of 15 ms at 640).
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ..image.ops import hwc_into_planes, planes_as_pixels, planes_into_hwc
from ..image.scratch import scratch
from .warp import antialiased, resize_weights, warp_batch

__all__ = [
    "index_matrix",
    "resize_chw",
    "resize_hwc",
    "warp_sample",
    "warp_pixels",
    "warp_planes_to_pixels",
    "warp_maps_batch",
    "warp_fast_batch",
]


def index_matrix(matrix: np.ndarray) -> np.ndarray:
    """A map of continuous coordinates as OpenCV's map of pixel indices."""
    shift = np.eye(3)
    shift[:2, 2] = 0.5
    unshift = np.eye(3)
    unshift[:2, 2] = -0.5
    return unshift @ np.asarray(matrix, dtype=np.float64) @ shift


def resize_chw(src: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """``src [C, h, w]`` uint8 resized to ``hw``, torchvision's way (antialiased when shrinking;
    enlarging with OpenCV's bilinear, the same pixels)."""
    oh, ow = int(hw[0]), int(hw[1])
    h, w = src.shape[-2:]
    if (h, w) == (oh, ow):
        return src
    if h <= oh and w <= ow:
        a = src.numpy()
        pixels = a.transpose(1, 2, 0) if a.strides[-1] != a.itemsize else planes_as_pixels(a)
        resized = cv2.resize(np.ascontiguousarray(pixels), (ow, oh), interpolation=cv2.INTER_LINEAR)
        out = np.empty((resized.reshape(oh, ow, -1).shape[2], oh, ow), np.uint8)
        hwc_into_planes(resized.reshape(oh, ow, -1), out)
        return torch.from_numpy(out)
    return antialiased(src, (oh, ow))


def resize_hwc(src: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """``src [h, w, C]`` uint8 pixels resized to ``hw``, ``resize_chw``'s pixels, channels-last:
    OpenCV's bilinear when enlarging, torch's antialiased kernel (on pixels, its channels-last
    kernel) when shrinking. ``src`` itself when the size is its own."""
    oh, ow = int(hw[0]), int(hw[1])
    h, w = src.shape[:2]
    if (h, w) == (oh, ow):
        return src
    if h <= oh and w <= ow:
        return cv2.resize(src, (ow, oh), interpolation=cv2.INTER_LINEAR).reshape(oh, ow, -1)
    resized = antialiased(torch.from_numpy(src).permute(2, 0, 1), (oh, ow)).permute(1, 2, 0)
    return resized.numpy() if resized.is_contiguous() else np.ascontiguousarray(resized.numpy())


def _scaled(matrix: np.ndarray, hw, shrink) -> np.ndarray:
    """The map from the ``shrink``-resized source (its pixels ``hw / shrink`` times larger)."""
    s = np.diag([hw[1] / shrink[1], hw[0] / shrink[0], 1.0])
    return np.asarray(matrix, dtype=np.float64) @ s


def _inverse(matrix: np.ndarray) -> tuple[np.ndarray, bool]:
    """OpenCV's inverse map of pixel indices for ``matrix``, and whether it is affine."""
    inverse = np.linalg.inv(index_matrix(matrix))
    return inverse, bool(np.allclose(inverse[2], (0.0, 0.0, 1.0), atol=1e-12))


def _warp(image: np.ndarray, inverse: np.ndarray, affine: bool, hw, fill: int, dst=None) -> np.ndarray:
    oh, ow = hw
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    if affine:
        return cv2.warpAffine(image, inverse[:2], (ow, oh), dst=dst, flags=flags,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 4)  # fmt: skip
    return cv2.warpPerspective(image, inverse, (ow, oh), dst=dst, flags=flags,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=(fill,) * 4)  # fmt: skip


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """This thread's reusable uint8 buffer for a warp's channels-last output (a fresh 640 x 640 x 3
    array costs its page faults every sample)."""
    return scratch("warpmatrix.warped", shape)


def warp_pixels(
    src: np.ndarray, matrix: np.ndarray, out_hw: tuple[int, int], fill: int = 0, shrink=None, into=None
) -> np.ndarray:
    """Channels-last ``src [H, W, C]`` (C > 1, rows contiguous) through ``matrix``: one OpenCV warp of
    all its channels into ``into [h, w, C]`` (a channels-last row) or this thread's scratch, which is
    returned (valid until the thread's next warp). ``shrink``: as ``warp_sample``."""
    hw = tuple(src.shape[:2])
    if shrink is not None and tuple(int(v) for v in shrink) != hw:
        matrix = _scaled(matrix, hw, shrink)
        src = resize_hwc(src, (int(shrink[0]), int(shrink[1])))
    if src.strides[1:] != (src.shape[2] * src.itemsize, src.itemsize):
        src = np.ascontiguousarray(src)
    oh, ow = int(out_hw[0]), int(out_hw[1])
    dst = into if into is not None else _scratch((oh, ow, src.shape[2]))
    inverse, affine = _inverse(matrix)
    found = _warp(src, inverse, affine, (oh, ow), fill, dst)
    if found is not dst:  # OpenCV wrote elsewhere (a buffer it could not take)
        dst[...] = found.reshape(dst.shape)
    return dst


def _scratch_named(name: str, shape: tuple[int, ...]) -> np.ndarray:
    return scratch(f"warpmatrix.{name}", shape)


def warp_planes_to_pixels(
    planes: np.ndarray, matrix: np.ndarray, out_hw: tuple[int, int], fill: int = 0, shrink=None
) -> np.ndarray:
    """Channels-first ``planes [C, H, W]`` (C > 1) through ``matrix``, as channels-last pixels
    ``[h, w, C]`` (this thread's scratch, valid until its next warp): a map that only scales and
    shifts warps plane by plane and interleaves the output (cheaper than interleaving the larger
    source: a mosaic's canvas), any other map interleaves the source and warps once
    (``warp_pixels``). The values of ``warp_sample``."""
    hw = tuple(planes.shape[-2:])
    if shrink is not None and tuple(int(v) for v in shrink) != hw:
        pixels = resize_hwc(planes_as_pixels(planes), (int(shrink[0]), int(shrink[1])))
        return warp_pixels(pixels, _scaled(matrix, hw, shrink), out_hw, fill)
    inverse, affine = _inverse(matrix)
    if not (affine and inverse[0, 1] == 0 and inverse[1, 0] == 0):
        return warp_pixels(planes_as_pixels(planes), matrix, out_hw, fill)
    oh, ow = int(out_hw[0]), int(out_hw[1])
    warped = _scratch_named("planes", (planes.shape[0], oh, ow))
    for c in range(planes.shape[0]):
        found = _warp(planes[c], inverse, affine, (oh, ow), fill, warped[c])
        if found.ctypes.data != warped[c].ctypes.data:  # OpenCV wrote elsewhere
            warped[c] = found
    pixels = _scratch((oh, ow, planes.shape[0]))
    planes_into_hwc(warped, pixels)
    return pixels


def warp_sample(
    src: np.ndarray, hwc: bool, matrix: np.ndarray, out: np.ndarray, fill: int = 0, shrink=None
) -> None:
    """``src`` (``[C, H, W]``, or ``[H, W, C]`` when ``hwc``) through ``matrix`` into ``out [C, h, w]``.

    ``shrink``: ``(height, width)`` the source is resized to first (antialiased), or None.
    """
    t = torch.from_numpy(src)
    t = t.permute(2, 0, 1) if hwc else t
    hw = tuple(t.shape[-2:])
    if shrink is not None and tuple(int(v) for v in shrink) != hw:
        matrix = _scaled(matrix, hw, shrink)
        t, hwc = resize_chw(t, (int(shrink[0]), int(shrink[1]))), False
    inverse, affine = _inverse(matrix)
    oh, ow = out.shape[-2:]
    planes = t.numpy()
    if not hwc and planes.shape[0] in (3, 4) and not (affine and inverse[0, 1] == 0 and inverse[1, 0] == 0):
        # A map that rotates, shears or bends: OpenCV warps pixels 1.3-4x faster than three planes
        # (a 640 x 640 rotation of a mosaic canvas: 1.2 against 4.5 ms), merging included; the
        # same values for affine maps. Scales and shifts alone stay plane by plane (0.5 against 0.6 ms).
        src, hwc = cv2.merge(list(planes)), True
    if hwc:  # pixels: one warp of them, then planes
        src = np.ascontiguousarray(src)
        warped = _warp(src, inverse, affine, (oh, ow), fill, _scratch((oh, ow, src.shape[2])))
        hwc_into_planes(warped.reshape(oh, ow, -1), out)
        return
    for c in range(planes.shape[0]):
        found = _warp(np.ascontiguousarray(planes[c]), inverse, affine, (oh, ow), fill, out[c])
        if found.ctypes.data != out[c].ctypes.data:  # OpenCV wrote elsewhere (a row it could not take)
            out[c] = found


def warp_maps_batch(
    images: torch.Tensor,
    matrices: torch.Tensor,
    sizes: torch.Tensor,
    out_hw: tuple[int, int],
    fill: float = 0.0,
    shrink: torch.Tensor | None = None,
) -> torch.Tensor:
    """``images`` uint8 ``[B, C, H, W]`` (each sample at the top left, ``sizes [B, 2]`` its own) through
    ``matrices [B, 3, 3]`` -> float ``[B, C, h, w]`` in [0, 255], with ``grid_sample``; ``shrink
    [B, 2]``: sizes resized to first, with the CPU path's filter (``warp.resize_weights``)."""
    device = images.device
    oh, ow = out_hw
    m = matrices.to(device=device, dtype=torch.float64)
    sizes = sizes.to(device=device)
    x = images.float()
    if shrink is not None:
        shrink = shrink.to(device=device)
        size_f, shrink_f = sizes.to(torch.float32), shrink.to(torch.float32)
        zeros = torch.zeros_like(size_f[:, 0])
        rows, cols = int(shrink[:, 0].max()), int(shrink[:, 1].max())
        wy = resize_weights(zeros, size_f[:, 0], size_f[:, 0], shrink_f[:, 0], rows, x.shape[2])
        wx = resize_weights(zeros, size_f[:, 1], size_f[:, 1], shrink_f[:, 1], cols, x.shape[3])
        x = torch.einsum("bcow,bpw->bcop", torch.einsum("boh,bchw->bcow", wy, x), wx)
        scale = torch.zeros_like(m)
        scale[:, 0, 0] = sizes[:, 1].double() / shrink[:, 1].double()
        scale[:, 1, 1] = sizes[:, 0].double() / shrink[:, 0].double()
        scale[:, 2, 2] = 1.0
        m, sizes = m @ scale, shrink
    _, _, height, width = x.shape
    valid = (torch.arange(height, device=device)[None, :] < sizes[:, :1])[:, None, :, None] & (
        torch.arange(width, device=device)[None, :] < sizes[:, 1:]
    )[:, None, None, :]
    x = (x - fill) * valid if fill else x * valid
    inverse = torch.linalg.inv(m)
    ys = torch.arange(oh, device=device, dtype=torch.float64) + 0.5
    xs = torch.arange(ow, device=device, dtype=torch.float64) + 0.5
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    points = torch.stack([gx.reshape(-1), gy.reshape(-1), torch.ones_like(gx).reshape(-1)])  # [3, P]
    src = inverse @ points  # [B, 3, P]
    w = src[:, 2]
    w = torch.where(w.abs() < 1e-12, torch.full_like(w, 1e-12), w)
    grid = torch.stack([2 * src[:, 0] / w / width - 1, 2 * src[:, 1] / w / height - 1], dim=-1)
    grid = grid.reshape(-1, oh, ow, 2).to(torch.float32)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out + fill if fill else out


def warp_fast_batch(
    images: torch.Tensor,
    boxes: torch.Tensor,
    hflips: torch.Tensor,
    vflips: torch.Tensor,
    sizes: torch.Tensor,
    out_hw: tuple[int, int],
    fill: float = 0.0,
) -> torch.Tensor:
    """Whole-pixel axis-aligned maps on the device: the crop+resize fast path, then vertical flips."""
    out = warp_batch(images, boxes, hflips, sizes, out_hw, fill)
    return torch.where(vflips.to(out.device)[:, None, None, None], out.flip(2), out)
