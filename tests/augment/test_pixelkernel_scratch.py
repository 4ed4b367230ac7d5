"""The row kernels that work in this thread's scratch (solarize, color, sharpness, affine) give the very
bytes of their plain definitions (written here as the OpenCV and numpy calls they replaced), allocate
nothing the size of a row per sample, and keep each thread's scratch to itself."""

from __future__ import annotations

import threading
import tracemalloc

import cv2
import numpy as np
import pytest

from cachekit.augment import pixelkernels
from cachekit.augment.autoaugment import op_matrix
from cachekit.tools.synthetic import synthetic_image


def _row(seed: int = 0, h: int = 48, w: int = 64, channels: int = 3) -> np.ndarray:
    """Photo-like planes with every level 0-255 somewhere."""
    img = synthetic_image(np.random.default_rng(seed), h, w)
    n = min(256, img.size)
    img.reshape(-1)[:n] = np.arange(n, dtype=np.uint8)
    chw = np.ascontiguousarray(img.transpose(2, 0, 1))
    if channels == 3:
        return chw
    return np.ascontiguousarray(np.concatenate([chw, chw[::-1]])[:channels])


def _solarize(x: np.ndarray, threshold: float) -> np.ndarray:
    return np.where(x >= threshold, 255 - x, x).astype(np.uint8)


def _color(x: np.ndarray, factor: float) -> np.ndarray:
    gray = cv2.addWeighted(x[0], 0.299, x[1], 0.587, 0.5, dtype=cv2.CV_32F)
    gray = cv2.scaleAdd(x[2].astype(np.float32), 0.114, gray).astype(np.uint8)
    return np.stack([cv2.addWeighted(p, factor, gray, 1.0 - factor, 0.0) for p in x])


def _sharpness(x: np.ndarray, factor: float) -> np.ndarray:
    flat = x.reshape(-1, x.shape[-1])
    smooth = cv2.filter2D(flat, -1, np.float32([[1, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13.0,
                          borderType=cv2.BORDER_REPLICATE)  # fmt: skip
    blended = cv2.addWeighted(flat, factor, smooth, 1.0 - factor, 0.0).reshape(x.shape)
    out = x.copy()
    out[:, 1:-1, 1:-1] = blended[:, 1:-1, 1:-1]
    return out


def _affine(x: np.ndarray, matrix: np.ndarray, fill: tuple[int, ...]) -> np.ndarray:
    h, w = x.shape[1:]
    return np.stack([
        cv2.warpAffine(p, matrix, (w, h), flags=cv2.INTER_NEAREST, borderMode=cv2.BORDER_CONSTANT,
                       borderValue=int(fill[c % len(fill)]))
        for c, p in enumerate(x)
    ])  # fmt: skip


@pytest.mark.parametrize(
    "threshold", [-3.0, 0.0, 0.25, 1.0, 1.5, 127.0, 127.5, 128.0, 178.5, 254.0, 254.9, 255.0, 255.5, 256.0, 400.0,
                  float("inf"), float("-inf")],
)  # fmt: skip
def test_solarize_is_its_definition_at_every_kind_of_threshold(threshold):
    x = _row()
    y = x.copy()
    pixelkernels.solarize(y, threshold)
    assert np.array_equal(y, _solarize(x, threshold))


def test_solarize_inverts_exactly_from_the_threshold_up():
    x = np.arange(256, dtype=np.uint8).reshape(1, 16, 16).repeat(3, axis=0)
    for threshold in range(257):
        y = x.copy()
        pixelkernels.solarize(y, float(threshold))
        assert np.array_equal(y[:, x[0] < threshold], x[:, x[0] < threshold])
        assert np.array_equal(y[:, x[0] >= threshold], 255 - x[:, x[0] >= threshold])


@pytest.mark.parametrize("factor", [0.0, 0.1, 0.73, 1.0, 1.9])
@pytest.mark.parametrize("shape", [(48, 64), (7, 5), (224, 224)])
def test_color_and_sharpness_are_their_definitions_bit_for_bit(factor, shape):
    x = _row(1, *shape)
    for kernel, reference in ((pixelkernels.color, _color), (pixelkernels.sharpness, _sharpness)):
        y = x.copy()
        kernel(y, factor)
        assert np.array_equal(y, reference(x, factor)), kernel.__name__


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
@pytest.mark.parametrize(
    "name, magnitude",
    [("ShearX", 0.3), ("ShearY", -0.3), ("Rotate", 30.0), ("Rotate", -17.0), ("TranslateX", 21.0),
     ("TranslateY", -13.0), ("TranslateX", 500.0)],
)  # fmt: skip
def test_affine_is_a_nearest_warp_of_each_plane_with_its_fill(channels, name, magnitude):
    x = _row(2, 40, 56, channels)
    fill = (11, 120, 250)  # one per channel, repeated past three: a swapped channel shows
    matrix = op_matrix(name, magnitude, 40, 56)
    y = x.copy()
    pixelkernels.affine(y, matrix, fill)
    assert np.array_equal(y, _affine(x, matrix, fill))
    assert not np.array_equal(y, x)


def test_kernels_of_other_sizes_one_after_another_reuse_the_scratch_correctly():
    """A thread's scratch grows and shrinks with the rows it is given (a big row, a small, a big)."""
    for h, w in ((224, 224), (17, 23), (64, 300), (224, 224)):
        x = _row(h + w, h, w)
        matrix = op_matrix("Rotate", 30.0, h, w)
        y = x.copy()
        pixelkernels.affine(y, matrix, (0,))
        pixelkernels.color(y, 0.4)
        pixelkernels.sharpness(y, 1.7)
        pixelkernels.solarize(y, 100.0)
        want = _solarize(_sharpness(_color(_affine(x, matrix, (0,)), 0.4), 1.7), 100.0)
        assert np.array_equal(y, want)


_MATRIX = op_matrix("ShearX", 0.2, 224, 224)
_KERNELS = {
    "solarize": lambda y: pixelkernels.solarize(y, 128.0),
    "color": lambda y: pixelkernels.color(y, 0.5),
    "sharpness": lambda y: pixelkernels.sharpness(y, 1.5),
    "affine": lambda y: pixelkernels.affine(y, _MATRIX, (0,)),
}


@pytest.mark.parametrize("name", list(_KERNELS))
def test_the_scratch_kernels_allocate_nothing_the_size_of_a_row_per_sample(name):
    kernel = _KERNELS[name]
    x = _row(3, 224, 224)
    plane = x[0].nbytes
    y = x.copy()
    kernel(y)  # the first sample makes this thread's scratch
    tracemalloc.start()
    try:
        kernel(y)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < plane // 4, f"{name} allocated {peak} bytes for a {plane}-byte plane"


def test_scratch_starts_off_the_vector_grid():
    """OpenCV's merge and split write a vector-aligned destination with non-temporal stores (the next
    kernel then reads it from memory): every scratch starts 16 bytes past a 64-byte boundary."""
    for k, shape in enumerate([(1,), (3, 5), (7, 9, 3), (100, 100), (224, 224, 3), (640, 640, 3)]):
        for dtype in (np.uint8, np.float32):
            buffer = pixelkernels._scratch_of(f"test{k}", shape, dtype)
            assert buffer.shape == shape and buffer.dtype == dtype
            assert buffer.ctypes.data % 64 == 16


def test_threads_keep_their_own_scratch():
    """Two threads running the kernels at once on rows of different sizes each get their own bytes."""
    rows = {0: _row(5, 224, 224), 1: _row(6, 96, 128)}
    want = {k: _sharpness(_affine(_color(x, 0.3), op_matrix("Rotate", 25.0, *x.shape[1:]), (9,)), 1.8)
            for k, x in rows.items()}  # fmt: skip
    got, errors = {k: [] for k in rows}, []

    def work(k: int) -> None:
        try:
            x = rows[k]
            matrix = op_matrix("Rotate", 25.0, *x.shape[1:])
            for _ in range(30):
                y = x.copy()
                pixelkernels.color(y, 0.3)
                pixelkernels.affine(y, matrix, (9,))
                pixelkernels.sharpness(y, 1.8)
                got[k].append(y)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for k in rows:
        assert all(np.array_equal(y, want[k]) for y in got[k])


def test_a_step_kernel_on_pixels_gives_its_row_kernels_bytes():
    """The protocol's optional ``apply_pixels(hwc, j)`` (RandomHSV's) is ``apply_row`` on channels-last pixels."""
    from cachekit.augment.protocol import PixelsKernel
    from cachekit.transforms import RandomHSV

    assert "apply_pixels" in PixelsKernel.__dict__
    idx = np.arange(4)
    draws = RandomHSV().draw_stage(7, 1, idx, 3, (40, 56))
    assert callable(getattr(draws, "apply_pixels", None))
    for j in range(len(idx)):
        x = _row(j, 40, 56)
        row, pixels = x.copy(), np.ascontiguousarray(x.transpose(1, 2, 0))
        draws.apply_row(row, j)
        draws.apply_pixels(pixels, j)
        assert np.array_equal(pixels.transpose(2, 0, 1), row)
        assert not np.array_equal(row, x)


def test_op_matrix_hands_out_a_new_array_each_time_while_the_maps_are_kept():
    from cachekit.augment.autoaugment import OpDraws
    from cachekit.image.instances import from_pixel_indices

    first = op_matrix("Rotate", 30.0, 40, 56)
    first[:] = 0  # a caller may change its map: the next sample's is still the op's
    again = op_matrix("Rotate", 30.0, 40, 56)
    assert again.flags.writeable and again is not first and np.abs(again).sum() > 1
    assert not np.array_equal(op_matrix("Rotate", -30.0, 40, 56), again)
    assert not np.array_equal(op_matrix("Rotate", 30.0, 56, 40), again)  # the size is part of the map
    names = ("Rotate", "TranslateX", "ShearY")
    draws = OpDraws(names, np.array([[0, 1, 2]]), np.array([[30.0, -9.0, 0.25]]), (5,), (40, 56))
    x = _row(4, 40, 56)
    y = x.copy()
    draws.apply_row(y, 0)
    want = x
    for name, m in zip(names, (30.0, -9.0, 0.25)):
        want = _affine(want, op_matrix(name, m, 40, 56), (5,))
    assert np.array_equal(y, want)
    # the same maps as its targets take them: each op's pixel-index map, converted once
    assert [m.tolist() for m in draws.matrices(0)] == [from_pixel_indices(op_matrix(n, m, 40, 56)).tolist()
                                                       for n, m in zip(names, (30.0, -9.0, 0.25))]  # fmt: skip
