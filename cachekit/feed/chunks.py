"""The threads over a batch: ``run_chunks`` hands pieces of a batch to this process's pool.

One pool a process (a forked child makes its own), its threads named ``cachekit-read``; the caller
takes pieces too, except from the user's own thread with a timeout, where it only waits, so that a
piece stuck for ever (storage that does not answer, a user op that never returns) ends in the
loader's ``timeout=`` as one ``ReadTimeout`` line, the pool with the stuck thread left behind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

from ..augment.warp import single_threaded_torch
from .prefetch import ReadTimeout

__all__ = ["CHUNK", "run_chunks"]


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _after_fork() -> None:
    """A forked child starts with no pool and a free lock (a thread may have held it at the fork)."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _forget(pool: ThreadPoolExecutor) -> None:
    """Leave ``pool`` (a thread of it is stuck) to finish on its own: the next batch makes a new one.

    Not shut down: a batch of another thread may have looked it up already and be about to hand it
    pieces; its idle threads end when the last batch using it lets it go (the executor's own rule).
    """
    with _pools_lock:
        if _pools.get(os.getpid()) is pool:
            del _pools[os.getpid()]


def _pool(threads: int) -> ThreadPoolExecutor:
    """This process's pool (a forked child makes its own: threads do not survive a fork)."""
    with _pools_lock:
        pool = _pools.get(os.getpid())
        if pool is None or pool._max_workers < threads:
            _pools.clear()
            pool = _pools[os.getpid()] = ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix="cachekit-read", initializer=single_threaded_torch
            )
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
        fn(0, n)
        return
    pieces = iter(range(0, n, size))  # next() on a range iterator is atomic under the GIL
    failed = threading.Event()

    def drain() -> None:
        for lo in pieces:
            if failed.is_set():
                return
            try:
                fn(lo, min(lo + size, n))
            except BaseException:
                failed.set()
                raise

    deadline = None if timeout is None else time.monotonic() + float(timeout)
    helpers = threads if waits_only else threads - 1
    pool = _pool(helpers)
    error = None
    try:
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
    except BaseException:  # Ctrl-C in the wait: the threads stop at their next piece, the interrupt goes on
        failed.set()
        raise
    if error is not None:
        raise error
