"""Recycled batch buffers: reused once nothing refers to them, never while anything does."""

from __future__ import annotations

import sys

import numpy as np
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
