"""A rank's share of a pass handed out a page at a time: ``PagedShare`` (an order evaluated at the
rank's positions, never built whole) and ``PAGE``, the indices turned into Python ints at once."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["PagedShare", "PAGE"]

#: Indices a sampler turns into Python ints at a time (a mix's epoch may hold 2**28 samples).
PAGE = 65536


class PagedShare:
    """A rank's indices of one pass of a dataset that orders its own epochs, computed a page at a
    time: ``share[lo:hi]`` is ``order[positions(lo, hi)]`` (``positions``: the rank's global
    positions ``lo .. hi`` of the pass); ``np.asarray`` makes it whole."""

    def __init__(self, order, positions: Callable[[int, int], np.ndarray], length: int) -> None:
        self.order = order  # a mix's order: evaluated at positions, never built
        self.positions, self.len = positions, int(length)

    def __len__(self) -> int:
        return self.len

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice):
            raise TypeError("a pass's share is read by slices")
        lo, hi, step = key.indices(self.len)
        if step != 1:
            raise ValueError("a pass's share is read by runs (a step of 1)")
        return self.order[self.positions(lo, max(lo, hi))]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[0 : self.len]
        return whole if dtype is None else whole.astype(dtype)

    def tolist(self) -> list:
        return self[0 : self.len].tolist()
