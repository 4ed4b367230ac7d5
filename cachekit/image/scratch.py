"""This thread's reusable buffers, by name: one per name and thread, grown when a larger one is asked.

A fresh array per sample costs its page faults (a 640 x 640 x 3 one about as much as a colour
conversion), so the kernels of the threads over a batch write into buffers kept per thread. Each
caller names its buffers with its module (``"warp.resized"``), so two that are live at once never
share bytes. Every buffer starts 16 bytes past a 64-byte boundary: OpenCV's ``merge`` and ``split``
write a destination aligned to their vectors with non-temporal stores, which bypass the cache, so
the next kernel would read it back from memory (a merge, nearest warp and split of 224 x 224 x 3 in
69 us from this offset, 185 us from an aligned buffer). A buffer is valid until its thread asks for
the same name again.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["scratch"]

_local = threading.local()
#: Where each buffer starts past a 64-byte boundary.
OFFSET = 16


def scratch(name: str, shape: tuple[int, ...], dtype=np.uint8) -> np.ndarray:
    """This thread's buffer ``name`` as a ``shape`` array of ``dtype`` (its contents left as they were)."""
    dtype = np.dtype(dtype)
    size = 1
    for n in shape:  # np.prod costs more than a small copy it sizes, at a few us a call
        size *= int(n)
    buffer = getattr(_local, name, None)
    if buffer is None or buffer.size < size or buffer.dtype != dtype:
        nbytes = max(size, 1) * dtype.itemsize
        raw = np.empty(nbytes + 64 + OFFSET, np.uint8)
        start = (OFFSET - raw.ctypes.data) % 64
        buffer = raw[start : start + nbytes].view(dtype)
        setattr(_local, name, buffer)
    return buffer[:size].reshape(shape)
