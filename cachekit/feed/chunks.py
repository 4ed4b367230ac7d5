"""The threads over a batch: ``run_chunks`` hands pieces of a batch to this process's pool.

One pool a process (a forked child makes its own), its threads named ``cachekit-read``; the caller
takes pieces too, except from the user's own thread with a timeout, where it only waits, so that a
piece stuck for ever (storage that does not answer, a user op that never returns) ends in the
loader's ``timeout=`` as one ``ReadTimeout`` line, the pool with the stuck thread left behind.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from ..augment.warp import single_threaded_torch
from .forking import working
from .timeouts import ReadTimeout

__all__ = ["CHUNK", "ReadPool", "abandon_busy_threads", "run_chunks"]


class ReadPool:
    """Daemon threads over batches, as ``ThreadPoolExecutor`` but never joined at interpreter exit:
    a thread stuck for ever in a user op (after its ``ReadTimeout``) must not keep the process from
    ending. Idle threads end when the pool is shut down or no longer referenced; at exit, threads
    that are not stuck are given the time to finish the piece they are in (``_join_at_exit``)."""

    def __init__(self, threads: int) -> None:
        self.max_workers = int(threads)
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._shutdown = False
        work = self._work  # the threads hold the queue, not the pool: an unused pool is collected
        self._wake = weakref.finalize(self, _stop_threads, work, self._threads)

    def submit(self, fn: Callable, *args) -> Future:
        future: Future = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._work.put((future, fn, args))
            if self._idle.acquire(blocking=False) or len(self._threads) >= self.max_workers:
                return future
            thread = threading.Thread(
                target=_serve, args=(self._work, self._idle), name=f"cachekit-read_{len(self._threads)}", daemon=True
            )
            # listed before it starts: a Ctrl-C inside start() must not leave a thread that shutdown
            # neither tells to stop nor counts (it would take another's stop and that one wait for ever)
            self._threads.append(thread)
            _LIVE.add(thread)
        thread.start()
        return future

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            self._shutdown = True
        self._wake()
        if wait:
            for thread in list(self._threads):
                if thread.ident is not None:  # started
                    thread.join()


def _stop_threads(work: queue.SimpleQueue, threads: list) -> None:
    for _ in threads:
        work.put(None)


def _serve(work: queue.SimpleQueue, idle: threading.Semaphore) -> None:
    """A pool thread: run what comes, until told to stop."""
    single_threaded_torch()
    try:
        while True:
            item = work.get()
            if item is None:
                return
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on it
                    future.set_exception(exc)
            del item, future, fn, args
            idle.release()
    finally:
        _LIVE.discard(threading.current_thread())


#: Pool threads that have not ended, and those left behind stuck (not waited for at exit).
_LIVE: weakref.WeakSet = weakref.WeakSet()
_STUCK: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _join_at_exit() -> None:
    """Give pool threads that are not stuck a moment to finish their piece before the interpreter goes
    (a daemon thread inside torch's C++ code at finalisation can abort the process); stuck ones are
    left: they hold the process no longer."""
    deadline = time.monotonic() + 5.0
    for pool in list(_pools.values()):
        pool.shutdown(wait=False)
    for thread in list(_LIVE):
        if thread not in _STUCK and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


_pools: dict[int, ReadPool] = {}
_pools_lock = threading.Lock()


def _after_fork() -> None:
    """A forked child starts with no pool and a free lock (a thread may have held it at the fork)."""
    global _pools_lock
    _pools.clear()
    _LIVE.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _forget(pool: ReadPool) -> None:
    """Leave ``pool`` (a thread of it is stuck) to finish on its own: the next batch makes a new one.

    Not shut down: a batch of another thread may have looked it up already and be about to hand it
    pieces; its idle threads end when the last batch using it lets it go. Its busy threads are not
    waited for at exit."""
    with _pools_lock:
        if _pools.get(os.getpid()) is pool:
            del _pools[os.getpid()]
    for thread in list(pool._threads):
        if thread.is_alive():
            _STUCK.add(thread)


def abandon_busy_threads() -> None:
    """Leave this process's pool, and its threads busy now, to themselves (the reader that waited on
    them gave up: ``ReadTimeout``): they are not waited for at exit; the next batch makes a new pool."""
    with _pools_lock:
        pool = _pools.get(os.getpid())
    if pool is not None:
        _forget(pool)


def _pool(threads: int) -> ReadPool:
    """This process's pool (a forked child makes its own: threads do not survive a fork)."""
    with _pools_lock:
        pool = _pools.get(os.getpid())
        if pool is None or pool.max_workers < threads:
            _pools.clear()
            pool = _pools[os.getpid()] = ReadPool(threads)
        return pool


#: Samples per piece of work handed to the threads over a batch: small enough that threads finish
#: together (crops differ in cost), large enough that taking a piece costs nothing.
CHUNK = 8


#: The longest the caller's wait for a thread sleeps at once: a Ctrl-C whose signal another thread
#: took is seen only when the caller wakes (a lock's wait is not interrupted by it).
WAIT_SLICE = 0.1


def _result(future, deadline: float | None) -> None:
    """``future``'s end, by ``deadline`` (``time.monotonic()``) or ``FutureTimeout``, waited in slices."""
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            future.result(WAIT_SLICE if left is None else max(0.0, min(WAIT_SLICE, left)))
            return
        except FutureTimeout:
            if left is not None and left <= WAIT_SLICE:
                raise


def run_chunks(n: int, threads: int, fn: Callable[[int, int], None], timeout: float | None = None) -> None:
    """``fn(lo, hi)`` over pieces of ``range(n)``, taken in turn by ``threads`` threads (the caller is one).

    ``timeout``: the longest the caller waits for the other threads, from the start (the loader's
    ``timeout=``), then ``ReadTimeout`` in one line; the pool with the stuck thread is left behind.
    Called from the user's own thread (a loader without its prefetch thread, in this process), the
    caller takes no piece itself and only waits, so a piece stuck for ever (a user op that never
    returns) cannot hold it past the timeout; a prefetch thread's wait is bounded by its consumer,
    a worker process's by the DataLoader's, so there the caller works too.

    Pieces of ``CHUNK`` samples (fewer when the batch is small for its threads, so that every
    thread has some: a batch of 16 mosaics on 16 threads goes out a sample at a time) are handed
    out as threads come free, so a thread that drew cheap samples takes more of them instead of
    waiting for one that drew expensive ones.
    """
    size = max(1, min(CHUNK, n // max(1, int(threads))))
    threads = max(1, min(int(threads), -(-n // size)))
    ours = threading.current_thread().name.startswith("cachekit-")
    if ours:  # our prefetch thread, not the user's
        single_threaded_torch()
    waits_only = timeout is not None and not ours and torch.utils.data.get_worker_info() is None
    if threads == 1 and not waits_only:
        with working():  # no fork copies this process while OpenCV may hold a lock (feed.forking)
            fn(0, n)
        return
    pieces = iter(range(0, n, size))  # next() on a range iterator is atomic under the GIL
    failed = threading.Event()

    def drain() -> None:
        for lo in pieces:
            if failed.is_set():
                return
            try:
                with working():
                    fn(lo, min(lo + size, n))
            except BaseException:
                failed.set()
                raise

    deadline = None if timeout is None else time.monotonic() + float(timeout)
    try:
        error = _share(drain, threads if waits_only else threads - 1, waits_only, deadline, failed, timeout)
    except BaseException:  # Ctrl-C in the wait: the threads stop at their next piece, the interrupt goes on
        failed.set()
        raise
    if error is not None:
        raise error


def _share(drain: Callable, helpers: int, waits_only: bool, deadline, failed: threading.Event, timeout):
    """``drain`` on ``helpers`` pool threads (and on this one unless it ``waits_only``), each waited
    for until ``deadline``; the first error, or None (a ``ReadTimeout`` at the deadline)."""
    pool = _pool(helpers)
    error = None
    futures = [pool.submit(drain) for _ in range(helpers)]
    try:
        if not waits_only:
            drain()
    except BaseException as exc:  # every thread stops before the error goes on
        error = exc
    if not waits_only:
        # no piece is left (or one failed): a helper not yet started has nothing to do, nor, called
        # from a thread of the pool itself, a free thread to start on, as the others wait on theirs
        futures = [future for future in futures if not future.cancel()]
    for future in futures:
        try:
            _result(future, deadline)
        except FutureTimeout:
            failed.set()  # the others stop at their next piece
            _forget(pool)
            raise ReadTimeout(
                f"a thread over the batch read no more samples in {timeout:g} s: a read is stuck "
                "(storage that does not answer, a lock held for ever, or a user op that never returns)"
            ) from None
        except Exception as exc:
            error = error or exc
    return error
