"""A background thread that runs an iterator a few items ahead of its consumer (the training step).

For a pixel cache a batch read is a memory copy; done in a thread it overlaps the training step
without the cost of worker processes (every batch copied into shared memory and out again).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Iterator

from .chunks import abandon_busy_threads
from .timeouts import READ_TIMEOUT_SECONDS, ReadTimeout

__all__ = ["Prefetcher", "ReadTimeout", "READ_TIMEOUT_SECONDS"]

log = logging.getLogger("cachekit")

#: Running prefetch threads and their stop events; a thread removes itself as its last act.
_LIVE: dict[threading.Thread, threading.Event] = {}
_LIVE_LOCK = threading.Lock()


@atexit.register
def _stop_prefetchers() -> None:
    """Let prefetch threads finish their current read before the interpreter goes away.

    A daemon thread still inside torch's C++ code when Python finalises aborts the process
    ("terminate called without an active exception"), and so does one that frees the last tensors
    of an abandoned loader then; each is stopped and joined first.
    """
    with _LIVE_LOCK:
        running = list(_LIVE.items())
    for _, stop in running:
        stop.set()
    for thread, _ in running:
        if thread is not threading.current_thread():
            thread.join(30)
            if thread.is_alive():
                log.warning("a loader's prefetch thread was still reading a batch 30 s after it was told to stop")


def _produce(source: list, out: queue.Queue, stop: threading.Event, end: object) -> None:
    """Put ``source[0]``'s items on ``out`` until it ends or ``stop`` is set.

    Everything heavy the thread holds (the iterator with its dataset, batches nobody will take)
    is dropped here, while the thread is still in ``_LIVE`` and so joined at exit.
    """

    def put(item) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    it = source.pop()
    try:
        for item in it:
            if not put((True, item)):
                return
            del item
        put((True, end))
    except BaseException as exc:  # handed to the consumer
        put((False, exc))
    finally:
        it = None  # noqa: F841 -- the iterator (and its dataset) is freed in this thread, now
        if stop.is_set():  # the consumer has gone: free what it left
            while True:
                try:
                    out.get_nowait()
                except queue.Empty:
                    break
        with _LIVE_LOCK:
            _LIVE.pop(threading.current_thread(), None)


class Prefetcher:
    """Runs an iterator in a daemon thread, ``depth`` items ahead; errors are re-raised in the caller.

    The caller waits at most ``timeout`` seconds for an item (``ReadTimeout`` then, in one line)."""

    _END = object()

    def __init__(self, it: Iterator, depth: int, timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.timeout = float(timeout)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_produce,
            args=([it], self._queue, self._stop, self._END),
            daemon=True,
            name="cachekit-prefetch",
        )
        with _LIVE_LOCK:
            _LIVE[self._thread] = self._stop
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Tell the thread to stop and wait for it ``timeout`` seconds at most (a warning if it reads on)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning(
                    "a loader's prefetch thread was still reading a batch %s s after it was told to stop", timeout
                )

    def __iter__(self) -> Iterator:
        try:
            since = time.monotonic()  # when the wait for the next item began
            while True:
                try:
                    ok, item = self._queue.get(timeout=0.2)
                except queue.Empty:
                    if self._thread.is_alive() and time.monotonic() - since > self.timeout:
                        with _LIVE_LOCK:  # stuck: not waited for at exit, so that the process can end
                            _LIVE.pop(self._thread, None)
                        abandon_busy_threads()  # nor the pool's threads it handed pieces to
                        raise ReadTimeout(
                            f"the loader's prefetch thread read no batch in {self.timeout:g} s: a read is "
                            "stuck (storage that does not answer, a lock held for ever, or a user op that "
                            "never returns)"
                        ) from None
                    if self._stop.is_set() and not self._thread.is_alive():
                        raise RuntimeError(
                            "this pass over the loader was ended because another began (iter() was "
                            "called on the loader again while this pass was being read): read one "
                            "pass at a time, or make a second loader to look at a batch"
                        ) from None
                    continue
                if not ok:
                    raise item
                if item is self._END:
                    return
                yield item
                since = time.monotonic()
        finally:
            self._stop.set()
