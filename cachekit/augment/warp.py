"""Crop + resize + flip of samples: torch's antialiased resize per sample on the CPU, one batched
matrix product per batch on a device.

Both read a sample's box (top, left, height, width in source pixels) the same way, as torchvision
resizes a crop: output pixel ``j`` is centred on source coordinate ``left + (j + 0.5) * width /
out_width``, and takes the source pixels around it weighted by a triangle as wide as one output
pixel (bilinear when enlarging, antialiased when shrinking: PIL's and torchvision v2's filter).
The CPU path is ``torch.nn.functional.interpolate(..., antialias=True)`` on the box itself,
torchvision's own kernel; the device path builds that filter's weights for every sample at once
and applies them as two batched matrix products. A box reaching outside its image (a crop larger
than the image, a letterbox) takes ``fill`` there. A flip mirrors the output.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ..image.ops import hwc_into_planes, planes_into_hwc
from ..image.scratch import scratch

__all__ = [
    "warp_planes",
    "warp_hwc",
    "flip_sample",
    "pixels_of",
    "warp_batch",
    "resize_weights",
    "single_threaded_torch",
    "antialiased",
]

_local = threading.local()
# Shard rows are read-only memory maps; torch only reads them here (once-per-process warning otherwise)
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=__name__)


def single_threaded_torch() -> None:
    """Run torch's kernels on one thread in the calling thread only (threads over a batch are the
    parallelism: two reader threads each using torch's whole pool halve throughput, measured).

    torch's ``set_num_threads`` is process-wide; OpenMP's own setting is per thread, so it is set
    through the OpenMP runtime torch loaded, once per thread. Where there is none, nothing changes.
    """
    if getattr(_local, "single", False):
        return
    _local.single = True
    torch.get_num_threads()  # torch sets this thread's OpenMP count on first use: let it, then ours
    omp = _openmp()
    if omp is not None:
        omp.omp_set_num_threads(1)


_omp = None


def _openmp():
    global _omp
    if _omp is None:
        _omp = False
        try:
            with open("/proc/self/maps") as fh:
                libs = sorted({line.split()[-1] for line in fh if "omp" in line.rsplit("/", 1)[-1]})
            for lib in libs:
                handle = ctypes.CDLL(lib)
                if hasattr(handle, "omp_set_num_threads"):
                    _omp = handle
                    break
        except OSError:
            pass
    return _omp or None


def _pixels(planes: np.ndarray) -> np.ndarray:
    """Planes ``[C, h, w]`` (any row strides: a crop of a memory-mapped row) as contiguous
    channels-last pixels ``[h, w, C]``.

    The crop is first copied into contiguous planes (numpy copies whole rows), then interleaved by
    ``cv2.merge``, whose vectorised loop then runs over each plane as one long row: 20 us for the
    average enlarging crop of a train-256 image against 28-34 us for ``cv2.mixChannels`` straight
    from the strided crop (and 37 against 49 us for a shrinking one), the same bytes.

    Both copies go to this thread's scratch (``image.scratch``: valid until its next
    sample), not fresh arrays: a fresh crop and fresh pixels cost their page faults each sample
    (merge, resize and split of a random crop of a train-256 image to 224 x 224: 135-148 against
    149-190 us on one thread, loaded machine).
    """
    c = planes.shape[0]
    crop = scratch("warp.crop_planes", planes.shape, planes.dtype)
    np.copyto(crop, planes)
    pixels = scratch("warp.crop_pixels", (*planes.shape[1:], c), planes.dtype)
    merged = cv2.merge(list(crop), pixels)
    if merged is not pixels:  # should OpenCV ever hand back an array of its own
        pixels[...] = merged.reshape(pixels.shape)
    return pixels


def pixels_of(out: np.ndarray) -> np.ndarray | None:
    """``out [C, h, w]`` as channels-last pixels ``[h, w, C]`` that OpenCV can write in place (each
    row's pixels contiguous: a row of a channels-last batch, or a window of one), else None."""
    if out.ndim != 3 or out.shape[0] == 1:
        return None
    hwc = out.transpose(1, 2, 0)
    item = hwc.itemsize
    return hwc if hwc.strides[2] == item and hwc.strides[1] == item * hwc.shape[2] else None


def _written(result: np.ndarray, dst: np.ndarray) -> None:
    """``dst`` holds ``result``: OpenCV wrote into it, or (should it ever hand back an array of its
    own) a copy does."""
    if result is not dst:
        dst[...] = result.reshape(dst.shape)


def flip_sample(out: np.ndarray, vertical: bool = False) -> None:
    """Mirror a sample ``out [C, h, w]`` in place, left-right (or upside down), in either layout."""
    hwc = pixels_of(out)
    if hwc is not None:
        _written(cv2.flip(hwc, 0 if vertical else 1, dst=hwc), hwc)
    elif vertical:
        for c in range(out.shape[0]):
            _written(cv2.flip(out[c], 0, dst=out[c]), out[c])
    else:  # every plane's rows at once
        rows = out.reshape(-1, out.shape[-1])
        _written(cv2.flip(rows, 1, dst=rows), rows)


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """This thread's reusable uint8 buffer of ``shape``, for a resize's channels-last output before
    it is split into a sample's planes (an enlarging crop took 116 us with a fresh 224 x 224 x 3
    array each sample, 104 us with this one, on one thread)."""
    return scratch("warp.resized", shape)


def antialiased(src: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``src [C, h, w]`` uint8 resized to ``size`` by torch's antialiased bilinear kernel
    (torchvision's). A 1 x 1 output goes through floats: torch's uint8 kernel fails an internal
    assertion on it."""
    x = _one_batch(src)
    if tuple(size) == (1, 1):
        x = F.interpolate(x.float(), size=(1, 1), mode="bilinear", antialias=True)[0]
        return x.round_().clamp_(0, 255).to(torch.uint8)
    return F.interpolate(x, size=size, mode="bilinear", antialias=True)[0]


def _one_batch(src: torch.Tensor) -> torch.Tensor:
    """``src [C, h, w]`` as a batch of one, its layout kept visible to torch.

    ``src[None]`` gives channels-last pixels a batch stride (C) that torch's layout test rejects,
    and the resize then runs its generic kernel, with a planar result: 177 against 106 us for a
    250 x 300 crop to 224 x 224 through the channels-last kernel a batch of one made from the
    pixels (``[1, h, w, C]`` seen as ``[1, C, h, w]``) gets.
    """
    if src.dim() == 3 and src.shape[0] > 1 and src.stride(0) < src.stride(2):  # channels last
        return src.permute(1, 2, 0)[None].permute(0, 3, 1, 2)
    return src[None]


def _resize_into(src: torch.Tensor, out: np.ndarray) -> None:
    """``src [C, h, w]`` (uint8, any strides) resized into ``out [C, H, W]``, torchvision's way.

    Enlarging needs no antialiasing, and OpenCV's bilinear samples the same triangle as torch's
    antialiased kernel there (one source pixel wide) in about half the time, but rounds in its own
    fixed point: about a fifth of the values differ from torchvision's by one level (never more);
    shrinking goes through torch's kernel, torchvision's own, and is the same bytes. Both run on
    channels-last pixels, where their code is vectorised across the channels: a crop of planes (3 or 4 of them) is merged
    into pixels first and the result split back into ``out``'s planes, and that still costs less
    (CPU time per 224 x 224 crop of a train-256 image: enlarging 101 us (merge, resize, split) against
    108 us plane by plane, shrinking 48 + 201 + 19 us against 290-345 us; the pixels are the same).
    """
    _resize_array(src.numpy(), out)


def _copy_into(a: np.ndarray, out: np.ndarray) -> None:
    """``a [C, h, w]`` into ``out [C, h, w]``, either of them planes or channels-last pixels seen
    channels-first: OpenCV interleaves planes into a channels-last row and splits pixels into planes
    (numpy copies those element by element: a center crop of planes into a channels-last batch read
    at 0.19x the planes' copy); the same layouts copy as they are."""
    into = pixels_of(out)
    pixels_in = a.ndim == 3 and a.shape[0] > 1 and a.strides[-1] != a.itemsize
    if into is not None and not pixels_in:
        planes_into_hwc(a, into)
    elif into is None and pixels_in and out.shape[0] > 1:
        hwc_into_planes(a.transpose(1, 2, 0), out)
    else:
        out[...] = a


def _resize_array(a: np.ndarray, out: np.ndarray, flip: bool = False) -> None:
    """``_resize_into`` for ``a [C, h, w]`` as a numpy array (a view of a memory-mapped row), mirrored
    left-right when ``flip``: the resized pixels in this thread's scratch (or torch's result) before
    they are split into ``out``'s planes, where they are hot (15-16 against 19-20 us a 224 x 224 x 3
    split and flip), else ``out`` after."""
    oh, ow = out.shape[-2:]
    h, w = a.shape[-2:]
    if (h, w) == (oh, ow):
        _copy_into(a, out)
        if flip:
            flip_sample(out)
        return
    if a.strides[-1] != a.itemsize:  # a channels-last image seen channels-first: its pixels as they are
        pixels = a.transpose(1, 2, 0)
    else:
        pixels = _pixels(a) if a.shape[0] in (3, 4) else None  # other plane counts: plane by plane
    if h <= oh and w <= ow:
        if pixels is None:
            for c in range(a.shape[0]):
                cv2.resize(a[c], (ow, oh), dst=out[c], interpolation=cv2.INTER_LINEAR)
            if flip:
                flip_sample(out)
            return
        into = pixels_of(out)  # a channels-last batch: straight into its row
        resized = into if into is not None else _scratch((oh, ow, pixels.shape[2]))
        _written(cv2.resize(pixels, (ow, oh), dst=resized, interpolation=cv2.INTER_LINEAR), resized)
        if flip:
            _written(cv2.flip(resized, 1, dst=resized), resized)
        if into is None:
            hwc_into_planes(resized, out)
        return
    x = torch.from_numpy(a if pixels is None else pixels.transpose(2, 0, 1))
    # channels-last out of a channels-last input: pixel rows into pixel rows for a channels-last
    # batch (numpy would walk the [C, h, w] views plane by plane, byte by byte: 190 us), or split
    # into the planes by OpenCV (8 us for 224 x 224 x 3, against 43 us for numpy's transposing copy,
    # 120 us into a batch's cold rows on a loader's thread)
    resized = antialiased(x, (oh, ow))
    into = pixels_of(out) if pixels is not None else None
    hwc = resized.permute(1, 2, 0)
    if into is not None:
        into[...] = hwc.numpy()
    elif hwc.is_contiguous() and out.shape[0] > 1:
        pixels = hwc.numpy()  # torch's own new array
        if flip:
            _written(cv2.flip(pixels, 1, dst=pixels), pixels)
            flip = False
        hwc_into_planes(pixels, out)
    else:
        out[...] = resized.numpy()
    if flip:
        flip_sample(out)


def _paste(src: torch.Tensor, box, inside: bool, fill: int, out: np.ndarray) -> None:
    """Resize the part of ``src [C, H, W]`` under ``box`` into ``out``; ``fill`` where the box leaves it."""
    top, left, h, w = (int(v) for v in box)
    if inside:
        _resize_into(src[:, top : top + h, left : left + w], out)
        return
    oh, ow = out.shape[-2:]
    out[...] = fill
    height, width = src.shape[-2:]
    r0, r1 = max(top, 0), min(top + h, height)
    c0, c1 = max(left, 0), min(left + w, width)
    if r0 >= r1 or c0 >= c1:
        return
    sy, sx = oh / h, ow / w  # the visible part's place in the output, to whole output pixels
    y0, y1 = round((r0 - top) * sy), round((r1 - top) * sy)
    x0, x1 = round((c0 - left) * sx), round((c1 - left) * sx)
    if y1 > y0 and x1 > x0:
        _resize_into(src[:, r0:r1, c0:c1], out[:, y0:y1, x0:x1])


def _resized(src: torch.Tensor, pre) -> torch.Tensor:
    """``src [C, H, W]`` resized whole to ``pre`` (height, width) first, when a list starts with Resize."""
    if pre is None or tuple(int(v) for v in pre) == tuple(src.shape[-2:]):
        return src
    return antialiased(src, (int(pre[0]), int(pre[1])))


def warp_planes(
    src: np.ndarray, box, flip: bool, inside: bool, out: np.ndarray, fill: int = 0, pre=None
) -> None:
    """Channels-first ``src [C, H, W]`` (a view: a memory-mapped row) into ``out [C, h, w]``, in place;
    resized to ``pre`` first when given (``box`` is then in the resized image's pixels)."""
    if inside and pre is None:  # the common case, straight from the row's pixels
        top, left, h, w = box
        _resize_array(src[:, top : top + h, left : left + w], out, flip)
        return
    _paste(_resized(torch.from_numpy(src), pre), box, inside, fill, out)
    if flip:
        flip_sample(out)


def warp_hwc(
    src: np.ndarray, box, flip: bool, inside: bool, out: np.ndarray, fill: int = 0, pre=None
) -> None:
    """Channels-last ``src [H, W, C]`` (a decoded image, a ``pixels-hwc`` row) into channels-first
    ``out [C, h, w]``."""
    if inside and pre is None:  # the common case, straight from the pixels (no tensor wrapping)
        top, left, h, w = box
        _resize_array(src[top : top + h, left : left + w].transpose(2, 0, 1), out, flip)
        return
    _paste(_resized(torch.from_numpy(src).permute(2, 0, 1), pre), box, inside, fill, out)
    if flip:
        flip_sample(out)


def resize_weights(
    start: torch.Tensor,
    length: torch.Tensor,
    size: torch.Tensor,
    out: torch.Tensor | int,
    rows: int,
    canvas: int,
) -> torch.Tensor:
    """``[B, rows, canvas]`` weights of the antialiased bilinear resize of each sample's span
    ``[start, start + length)`` of source pixels to ``out`` pixels (per sample, at most ``rows``),
    along one axis.

    The triangle filter is as wide as one output pixel (at least one source pixel), normalised over
    the span's pixels as torch's resize of the crop is. A span reaching past the image (``size``
    pixels) is done as the CPU path does it: the part inside the image is resized into its place
    in the output, rounded to whole output pixels, and the rest of the output gets no weight (the
    caller adds the fill there); rows past a sample's ``out`` are zero too.
    """
    out = torch.as_tensor(out, dtype=start.dtype, device=start.device).expand_as(start)
    r0, r1 = torch.clamp(start, min=0.0), torch.minimum(start + length, size)
    scale = out / length  # output pixels per source pixel
    y0, y1 = torch.round((r0 - start) * scale), torch.round((r1 - start) * scale)
    y1 = torch.where(r1 > r0, torch.maximum(y1, y0), y0)
    per = ((r1 - r0) / (y1 - y0).clamp(min=1.0))[:, None, None]  # source pixels per output pixel
    support = torch.clamp(per, min=1.0)
    index = torch.arange(rows, device=start.device, dtype=start.dtype)[None, :, None]
    centres = r0[:, None, None] + (index - y0[:, None, None] + 0.5) * per
    pixels = torch.arange(canvas, device=start.device, dtype=start.dtype)[None, None, :] + 0.5
    weights = torch.clamp(1.0 - (pixels - centres).abs() / support, min=0.0)
    weights = weights * ((pixels >= r0[:, None, None]) & (pixels < r1[:, None, None]))
    weights = weights / weights.sum(dim=2, keepdim=True).clamp(min=1e-12)
    inside = (index >= y0[:, None, None]) & (index < y1[:, None, None]) & (index < out[:, None, None])
    return weights * inside


def _axis(start, length, size, out: int, canvas: int, pre: torch.Tensor | None) -> torch.Tensor:
    """One axis's ``[B, out, canvas]`` weights: the span of the (``pre``-resized) image onto ``out``."""
    if pre is None:
        return resize_weights(start, length, size, out, out, canvas)
    rows = int(pre.max().item()) if len(pre) else 0  # the resized images' canvas
    first = resize_weights(torch.zeros_like(size), size, size, pre, rows, canvas)  # [B, rows, canvas]
    return resize_weights(start, length, pre, out, out, rows) @ first


def warp_batch(
    images: torch.Tensor,
    boxes: torch.Tensor,
    flips: torch.Tensor,
    sizes: torch.Tensor,
    out_hw: tuple[int, int],
    fill: float = 0.0,
    pre: torch.Tensor | None = None,
) -> torch.Tensor:
    """``images`` uint8 ``[B, C, H, W]`` (samples at the top left of a padded canvas, each of its own
    ``sizes [B, 2]``) -> float ``[B, C, h, w]`` in [0, 255]; ``boxes``, ``flips`` per sample;
    ``pre [B, 2]``: sizes the images are resized to first (the boxes are then in those pixels)."""
    device = images.device
    oh, ow = out_hw
    _, _, canvas_h, canvas_w = images.shape
    boxes = boxes.to(device=device, dtype=torch.float32)
    sizes = sizes.to(device=device, dtype=torch.float32)
    pre = pre.to(device=device, dtype=torch.float32) if pre is not None else None
    top, left, h, w = boxes.unbind(1)
    wy = _axis(top, h, sizes[:, 0], oh, canvas_h, None if pre is None else pre[:, 0])  # [B, oh, H]
    wx = _axis(left, w, sizes[:, 1], ow, canvas_w, None if pre is None else pre[:, 1])  # [B, ow, W]
    wx = torch.where(flips.to(device)[:, None, None], wx.flip(1), wx)
    x = images.float() - fill if fill else images.float()
    rows = torch.einsum("boh,bchw->bcow", wy, x)
    out = torch.einsum("bcow,bpw->bcop", rows, wx)
    return out + fill if fill else out
