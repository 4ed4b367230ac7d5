"""Recycled batch buffers: reused once nothing refers to them, never while anything does."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from cachekit import CachedDataset
from cachekit.feed.buffers import BufferPool


def test_a_held_batch_is_never_overwritten(small_cache, monkeypatch):
    monkeypatch.setattr(sys, "getrefcount", lambda obj: 1)  # as if every object looked free
    ds = CachedDataset(small_cache)
    held, _ = ds.read_batch(list(range(8)))
    view = held[2:5]  # a view alone keeps the memory too
    expected = view.clone()
    array = held.numpy()
    del held
    for start in range(0, 32, 8):  # more reads of the same shape than the pool keeps
        ds.read_batch(list(range(start + 8, start + 16)) if start + 16 <= 40 else list(range(8)))
    assert torch.equal(view, expected)
    assert np.array_equal(array[2:5], expected.numpy())


def test_a_released_batch_is_reused():
    pool = BufferPool(keep=2)
    first = torch.from_numpy(pool.get((4, 3, 8, 8)))
    pointer = first.data_ptr()
    second = torch.from_numpy(pool.get((4, 3, 8, 8)))
    assert second.data_ptr() != pointer  # the first is still held
    del first
    again = torch.from_numpy(pool.get((4, 3, 8, 8)))
    assert again.data_ptr() == pointer
    other = pool.get((2, 3, 8, 8))
    assert other.shape == (2, 3, 8, 8)  # another shape gets its own block


def test_blocks_start_on_a_64_byte_boundary():
    """Rows of 224 x 224 planes then start on 32-byte boundaries too, where OpenCV splits a window
    of pixels straight into them (off them it crawls, so the window would be copied first)."""
    pool = BufferPool(keep=0)
    for shape, dtype in (((3, 3, 224, 224), np.uint8), ((5, 3, 7, 9), np.float32), ((1,), np.uint8)):
        block = pool.get(shape, dtype)
        assert block.ctypes.data % 64 == 0 and block.shape == shape and block.dtype == dtype
        assert block.flags.c_contiguous and block.flags.writeable
        block[...] = 7
        assert (block == 7).all()


def test_a_shape_numpy_refuses_is_refused():
    """A negative side is refused as ``np.empty`` refuses it: the aligned block took -1 as reshape's
    "whatever is left" and handed out an empty batch; a side past any memory is no reshape error."""
    pool = BufferPool()
    for shape in ((-1, 4), (3, -1), (2, -3, 5)):
        with pytest.raises(ValueError, match="negative dimensions"):
            pool.get(shape, np.float32)
    with pytest.raises((ValueError, MemoryError)) as caught:
        pool.get((2**40, 2**40))
    assert "reshape" not in str(caught.value)
    assert pool.get((0, 3), np.float32).shape == (0, 3)
