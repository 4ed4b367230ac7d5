"""A keyed random permutation of ``range(n)`` evaluated at any positions, without building it.

A block's samples are shuffled by a small Feistel network over the next even power of two above
``n`` (cycle-walking back into ``range(n)``): position ``i`` of the shuffled block is
``permute(i, n, key)``. So a rank computes the samples at its own positions of a block of any size
in memory proportional to its positions, never to the block; every rank computing with the same
key gets the same permutation, and ``permute(arange(n), n, key)`` is ``range(n)`` reordered.
"""

from __future__ import annotations

import numpy as np

__all__ = ["permute", "mix64", "ROUNDS"]

#: Feistel rounds: six rounds of a 64-bit mixer make the permutation indistinguishable from a
#: random one for shuffling (four are already a pseudo-random permutation in theory).
ROUNDS = 6

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
#: One constant a round (odd multiples of the golden ratio, wrapped to 64 bits).
_ROUND_KEYS = [np.uint64((0x9E3779B97F4A7C15 * (2 * r + 1)) % 2**64) for r in range(ROUNDS)]


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise on uint64 (wraps, as intended)."""
    x = np.asarray(x, dtype=np.uint64)
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def _bits(n: np.ndarray) -> np.ndarray:
    """Bits of the Feistel domain for blocks of ``n``: at least 2, even, ``2**bits >= n``."""
    need = np.ceil(np.log2(np.maximum(n, 2).astype(np.float64))).astype(np.int64)
    need = np.where((np.int64(1) << need) < n, need + 1, need)  # float rounding at 2**53 and up
    return np.maximum(2, need + (need & 1))


def permute(i, n, key) -> np.ndarray:
    """Position ``i`` of a random permutation of ``range(n)`` keyed by ``key``, element-wise.

    ``i``, ``n`` and ``key`` broadcast together (``0 <= i < n``; ``key`` any uint64), so one call
    serves positions of many blocks of different sizes, each with its own key.
    """
    i = np.asarray(i, dtype=np.int64)
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), i.shape)
    key = np.broadcast_to(np.asarray(key, dtype=np.uint64), i.shape)
    if i.size and ((i < 0) | (i >= n)).any():
        raise ValueError("permute: positions must lie in range(n)")
    half = (_bits(n) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    x = i.astype(np.uint64).copy()
    todo = np.flatnonzero(n > 1)
    while todo.size:  # cycle-walking: a value past n goes round again, until it lands inside
        y, h, m, k = x[todo], half[todo], mask[todo], key[todo]
        for r in _ROUND_KEYS:
            left, right = y >> h, y & m
            f = mix64(right ^ k ^ r) & m
            y = (right << h) | (left ^ f)
        x[todo] = y
        todo = todo[y >= n[todo].astype(np.uint64)]
    return x.astype(np.int64)
