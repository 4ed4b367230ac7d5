"""OpenCV's own thread pool held to one thread: while worker processes are forked (a child forked
while the pool is alive deadlocks in its first OpenCV call), and where threads over a batch are the
parallelism (OpenCV's pool costs small images more than it gives)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import cv2

__all__ = ["opencv_single_threaded", "use_one_opencv_thread"]

_set_once = False


@contextlib.contextmanager
def opencv_single_threaded() -> Iterator[None]:
    """OpenCV on one thread in this process for the block, its thread count restored after it."""
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)


def use_one_opencv_thread() -> None:
    """OpenCV on one thread in this process from now on (set once: later calls cost nothing)."""
    global _set_once
    if not _set_once:
        cv2.setNumThreads(1)
        _set_once = True
