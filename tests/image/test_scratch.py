"""This thread's reusable buffers: one per name and thread, kept while big enough, off OpenCV's vector grid."""

from __future__ import annotations

import threading
import uuid

import numpy as np

from cachekit.image.scratch import OFFSET, scratch


def test_a_name_keeps_its_bytes_and_grows_when_asked_for_more():
    name = f"test.kept.{uuid.uuid4()}"  # new to this thread, however often the tests run in this process
    a = scratch(name, (4, 5))
    a[...] = 7
    again = scratch(name, (2, 3))  # smaller: the same bytes, reshaped
    assert np.shares_memory(a, again) and again.shape == (2, 3) and (again == 7).all()
    bigger = scratch(name, (40, 50))
    assert bigger.shape == (40, 50) and not np.shares_memory(a, bigger)
    assert np.shares_memory(scratch(name, (40, 50)), bigger)


def test_names_and_dtypes_never_share_bytes():
    a, b = scratch("test.one", (8, 8)), scratch("test.two", (8, 8))
    assert not np.shares_memory(a, b)
    f = scratch("test.one", (8, 8), np.float32)  # another dtype: a buffer of its own
    assert f.dtype == np.float32 and f.shape == (8, 8) and not np.shares_memory(f, b)


def test_every_buffer_starts_16_bytes_past_a_64_byte_boundary():
    for k, shape in enumerate([(1,), (3, 5), (224, 224, 3), (640, 640, 3), (0, 3)]):
        for dtype in (np.uint8, np.float32):
            buffer = scratch(f"test.grid{k}", shape, dtype)
            assert buffer.shape == shape and buffer.dtype == dtype and buffer.flags.c_contiguous
            assert buffer.ctypes.data % 64 == OFFSET == 16


def test_each_thread_has_its_own():
    here = scratch("test.thread", (16,))
    there = []
    worker = threading.Thread(target=lambda: there.append(scratch("test.thread", (16,))))
    worker.start()
    worker.join(30)
    assert there and not np.shares_memory(here, there[0])
