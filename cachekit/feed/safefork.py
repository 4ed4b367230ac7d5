"""A fork whose child proves OpenCV usable before it works, and is forked again where it is not.

``feed.forking`` keeps cachekit's own threads, OpenCV's thread pool and imports under way out of
the way of a fork. A thread of the user's own can still be inside an OpenCV call at that instant,
holding one of OpenCV's global locks (its thread-local storage's, taken at each thread's first
call and whenever a call makes per-thread data): the child inherits it held, and its first OpenCV
call waits for ever (torch's own DataLoader workers do the same). So each worker process this
context starts first runs the OpenCV calls the loader makes, on a few pixels, in its main thread and
in a new one, within ``PROBE_SECONDS``; it tells its parent so through a pipe, and only then
becomes the worker. One that cannot is killed and forked again (the lock is held only for an
instant): ``ATTEMPTS`` in all, then one line that says what to do.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing.context
import os
import random
import select
import signal
import threading
import time

import cv2
import numpy as np

from ..errors import UsageError
from ..lifetime import die_with_parent
from .forking import forked_from_main_thread

log = logging.getLogger("cachekit")

__all__ = ["ATTEMPTS", "PROBE_SECONDS", "CheckedForkContext", "ForkWedged", "probe_opencv"]

#: The longest a new worker may take to show its OpenCV calls return, before it counts as wedged.
PROBE_SECONDS = 5.0
#: Forks of one worker before the loader gives up.
ATTEMPTS = 6
#: A wedged worker's exit code (its OpenCV calls did not return).
WEDGED = 75
#: The longest the parent waits for a new worker's word, whatever happens to it.
READY_SECONDS = 3 * PROBE_SECONDS


class ForkWedged(UsageError):
    """Worker processes kept inheriting a lock of OpenCV's held by another thread at the fork."""


@functools.cache
def _tiny_jpeg() -> bytes:
    """A JPEG of a few pixels, made in the parent (the child decodes it)."""
    return cv2.imencode(".jpg", np.full((8, 8, 3), 127, np.uint8))[1].tobytes()


def probe_opencv() -> None:
    """The OpenCV calls a loader's worker makes, on a few pixels: each returns unless a lock of
    OpenCV's is held for ever (by a thread that is gone)."""
    image = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    planes = cv2.split(image)
    cv2.merge(planes)
    cv2.resize(image, (12, 10), interpolation=cv2.INTER_AREA)
    cv2.resize(image, (40, 40), interpolation=cv2.INTER_LINEAR)
    matrix = np.array([[1.0, 0.1, 1.0], [0.0, 1.0, 2.0]])
    cv2.warpAffine(image, matrix, (16, 16))
    cv2.warpPerspective(image, np.vstack([matrix, [0.0, 0.001, 1.0]]), (16, 16))
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    gray = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    cv2.calcHist([gray], [0], None, [256], [0, 256])
    cv2.LUT(gray, np.arange(256, dtype=np.uint8))
    cv2.addWeighted(image, 0.5, image, 0.5, 0)
    cv2.GaussianBlur(image, (3, 3), 1.0)
    cv2.copyMakeBorder(image, 1, 1, 1, 1, cv2.BORDER_CONSTANT, value=0)
    cv2.flip(image, 1)
    cv2.imdecode(np.frombuffer(_tiny_jpeg(), np.uint8), cv2.IMREAD_COLOR)


def _prove_or_exit() -> None:
    """In a new child: ``probe_opencv`` in this thread and in a new one, or exit ``WEDGED``."""
    timer = threading.Timer(PROBE_SECONDS, os._exit, args=(WEDGED,))
    timer.daemon = True
    timer.start()
    other = threading.Thread(target=probe_opencv, daemon=True, name="cachekit-probe")
    other.start()
    probe_opencv()
    other.join()
    timer.cancel()


class CheckedForkProcess(multiprocessing.context.ForkProcess):
    """A forked process that runs its target only once its OpenCV calls are shown to return."""

    _ready_fd: int | None = None

    def run(self) -> None:
        # first: a child that wedges before torch calls worker_init_fn must still end with its parent
        die_with_parent(self._parent_pid, kernel=forked_from_main_thread())
        fd, self._ready_fd = self._ready_fd, None
        if fd is not None:
            _prove_or_exit()
            os.write(fd, b"1")
            os.close(fd)
        super().run()

    def start(self) -> None:
        _tiny_jpeg()  # made here: the child only decodes it
        target, args, kwargs = self._target, self._args, self._kwargs
        for attempt in range(ATTEMPTS):
            read, self._ready_fd = os.pipe()
            try:
                super().start()
            finally:
                os.close(self._ready_fd)
                self._ready_fd = None
            ready = _answer(read, READY_SECONDS)
            os.close(read)
            if ready:
                return
            self._discard()
            log.info("a worker process forked while another thread held a lock of OpenCV's: forked again")
            self._target, self._args, self._kwargs = target, args, kwargs
            time.sleep(random.uniform(0.001, 0.05) * (attempt + 1))  # another instant
        raise ForkWedged(
            f"worker processes forked {ATTEMPTS} times from this one inherited a lock of OpenCV's held by "
            "another thread in an OpenCV call at the fork, and could not use OpenCV: keep threads of your own "
            "out of OpenCV while a loader starts its workers, or pass multiprocessing_context='forkserver' "
            "(with the code that reads the loader under if __name__ == \"__main__\":)"
        )

    def _discard(self) -> None:
        """Kill the child that could not prove itself, reap it, and make this object startable again."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.join()
        self._popen = None


def _answer(fd: int, timeout: float) -> bool:
    """Whether the child wrote its byte within ``timeout`` (EOF: it exited first)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            return os.read(fd, 1) == b"1"


class CheckedForkContext(multiprocessing.context.ForkContext):
    """The fork start method, with ``CheckedForkProcess`` processes (``get_start_method()``: fork)."""

    Process = CheckedForkProcess
