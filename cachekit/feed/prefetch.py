"""A background thread that runs an iterator a few items ahead of its consumer (the training step).

For a pixel cache a batch read is a memory copy; done in a thread it overlaps the training step
without the cost of worker processes (every batch copied into shared memory and out again).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Iterator

__all__ = ["Prefetcher"]

_LIVE_PREFETCHERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_prefetchers() -> None:
    """Let prefetch threads finish their current read before the interpreter goes away.

    A daemon thread still inside torch's C++ code when Python finalises aborts the process
    ("terminate called without an active exception"), so each is stopped and joined first.
    """
    for prefetcher in list(_LIVE_PREFETCHERS):
        prefetcher.stop(timeout=30)


class Prefetcher:
    """Runs an iterator in a daemon thread, ``depth`` items ahead; errors are re-raised in the caller."""

    _END = object()

    def __init__(self, it: Iterator, depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(it,), daemon=True, name="cachekit-prefetch")
        _LIVE_PREFETCHERS.add(self)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, it: Iterator) -> None:
        try:
            for item in it:
                if not self._put((True, item)):
                    return
        except BaseException as exc:  # handed to the consumer
            self._put((False, exc))
            return
        self._put((True, self._END))

    def __iter__(self) -> Iterator:
        try:
            while True:
                ok, item = self._queue.get()
                if not ok:
                    raise item
                if item is self._END:
                    return
                yield item
        finally:
            self._stop.set()
