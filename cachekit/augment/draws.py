"""Counter-based random numbers: a sample's draws depend on (seed, epoch, sample index, stream) alone.

A generator object per sample would make draws depend on call order, threads or workers; hashing
the coordinates instead gives every sample its own numbers, reproducible anywhere, computed for a
whole batch at once with a few vectorised integer operations (the splitmix64 finaliser).
"""

from __future__ import annotations

import numpy as np

__all__ = ["keyed_generator", "uniforms"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_MASK = 2**64 - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that scrambles every bit into every other."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _key(*parts: int) -> np.ndarray:
    key = np.zeros(1, dtype=np.uint64)
    for part in parts:
        key = _mix(key ^ np.array([int(part) & _MASK], dtype=np.uint64)) + _GOLDEN
    return key


def uniforms(seed: int, epoch: int, indices: np.ndarray, stream: int, count: int) -> np.ndarray:
    """``[len(indices), count]`` float64 numbers in [0, 1) for these samples in this epoch.

    ``stream`` separates independent uses (one per transform) so they never share numbers.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _key(seed, epoch, stream)
        counter = idx[:, None] * np.uint64(count) + np.arange(count, dtype=np.uint64)[None, :]
        bits = _mix(_mix(counter ^ key) + _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)


def keyed_generator(seed: int, epoch: int, index: int, stream: int) -> np.random.Generator:
    """A generator that depends on (seed, epoch, index, stream) alone (Philox keyed by their hash)."""
    bits = (uniforms(seed, epoch, np.array([index]), stream, 2)[0] * 2.0**53).astype(np.uint64)
    return np.random.Generator(np.random.Philox(key=bits))
