"""Crop + resize + flip of samples: OpenCV per sample on the CPU, one ``grid_sample`` per batch on a device.

Both read a sample's box (top, left, height, width in source pixels) the same way: output pixel
``j`` samples source coordinate ``left + (j + 0.5) * width / out_width - 0.5`` (pixel centres at
integers), bilinearly, clamped to the box, which is what OpenCV's ``INTER_LINEAR`` resize of the
box does; a flip mirrors the output. A box reaching outside its image (a crop larger than the
image) is sampled with zeros outside instead, on both paths.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ..image.ops import hwc_into_planes

__all__ = ["warp_planes", "warp_hwc", "warp_batch"]


def _affine(box, out_hw: tuple[int, int]) -> np.ndarray:
    """The matrix taking output pixel centres to source coordinates (for ``WARP_INVERSE_MAP``)."""
    top, left, h, w = (float(v) for v in box)
    sy, sx = h / out_hw[0], w / out_hw[1]
    return np.array([[sx, 0.0, left + 0.5 * sx - 0.5], [0.0, sy, top + 0.5 * sy - 0.5]], dtype=np.float64)


def _warp_plane(src: np.ndarray, box, inside: bool, out: np.ndarray) -> None:
    top, left, h, w = (int(v) for v in box)
    oh, ow = out.shape[:2]
    if inside:
        roi = src[top : top + h, left : left + w]
        if (h, w) == (oh, ow):
            np.copyto(out, roi)
        else:
            cv2.resize(roi, (ow, oh), dst=out, interpolation=cv2.INTER_LINEAR)
    else:
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        cv2.warpAffine(
            src, _affine(box, (oh, ow)), (ow, oh), dst=out, flags=flags, borderMode=cv2.BORDER_CONSTANT
        )


def warp_planes(src: np.ndarray, box, flip: bool, inside: bool, out: np.ndarray) -> None:
    """Channels-first ``src [C, H, W]`` (a view: a memory-mapped row) into ``out [C, h, w]``, in place."""
    for c in range(src.shape[0]):
        _warp_plane(src[c], box, inside, out[c])
    if flip:  # every plane's rows at once
        rows = out.reshape(-1, out.shape[-1])
        cv2.flip(rows, 1, dst=rows)


def warp_hwc(src: np.ndarray, box, flip: bool, inside: bool, out: np.ndarray) -> None:
    """Channels-last ``src [H, W, C]`` (a freshly decoded image) into channels-first ``out [C, h, w]``."""
    tmp = np.empty((out.shape[1], out.shape[2], src.shape[2]), dtype=np.uint8)
    _warp_plane(src, box, inside, tmp)
    if flip:
        cv2.flip(tmp, 1, dst=tmp)
    hwc_into_planes(tmp, out)


def warp_batch(
    images: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    inside: torch.Tensor,
    out_hw: tuple[int, int],
) -> torch.Tensor:
    """``images`` uint8 ``[B, C, H, W]`` (samples at the top left of a padded canvas) -> float ``[B, C, h, w]``.

    Values stay in [0, 255]; ``boxes``, ``flips`` and ``inside`` are per-sample tensors on any device.
    """
    device = images.device
    oh, ow = out_hw
    _, _, canvas_h, canvas_w = images.shape
    boxes = boxes.to(device=device, dtype=torch.float32)
    top, left, h, w = boxes.unbind(1)
    cols = torch.arange(ow, device=device, dtype=torch.float32) + 0.5
    rows = torch.arange(oh, device=device, dtype=torch.float32) + 0.5
    xs = left[:, None] + cols[None, :] * (w / ow)[:, None] - 0.5  # [B, ow] source pixel centres
    ys = top[:, None] + rows[None, :] * (h / oh)[:, None] - 0.5  # [B, oh]
    inside = inside.to(device)[:, None]
    # clamp to the box, as a resize of the box does; outside-image boxes keep zero padding
    xs = torch.where(inside, torch.minimum(torch.maximum(xs, left[:, None]), (left + w - 1)[:, None]), xs)
    ys = torch.where(inside, torch.minimum(torch.maximum(ys, top[:, None]), (top + h - 1)[:, None]), ys)
    xs = torch.where(flips.to(device)[:, None], xs.flip(1), xs)
    gx = (xs + 0.5) * (2.0 / canvas_w) - 1.0
    gy = (ys + 0.5) * (2.0 / canvas_h) - 1.0
    grid = torch.stack(torch.broadcast_tensors(gx[:, None, :], gy[:, :, None]), dim=-1)
    return F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=False)
