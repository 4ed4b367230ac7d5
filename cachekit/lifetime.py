"""A child process that ends with the process that started it, however that one ends (SIGKILL too).

Shared by the build's worker pool and the loader's worker processes: a worker left behind holds
memory, ``/dev/shm`` and, for a build, a cache being written.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

__all__ = ["die_with_parent", "WATCH_SECONDS"]

_PR_SET_PDEATHSIG = 1

#: How often the watching thread looks whether the parent is still there.
WATCH_SECONDS = 0.5

#: (this process, the parent it ends with), once armed.
_watched: tuple[int, int] | None = None


def die_with_parent(parent: int, *, kernel: bool = True) -> None:
    """End this process when ``parent`` (its parent now) is gone.

    ``kernel``: the kernel sends SIGKILL at once (Linux's ``PR_SET_PDEATHSIG``): right only where the
    parent's thread that started this process lives as long as the parent (its main thread), since
    the signal comes when that thread ends. Without it, or where the kernel cannot, a daemon thread
    looks every ``WATCH_SECONDS`` (and a child of a process that is already gone ends at once).
    """
    global _watched
    if _watched == (os.getpid(), parent):
        return  # already ends with it (a worker is armed when forked and again at its init)
    armed = False
    if kernel and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    if os.getppid() != parent:
        os._exit(1)
    _watched = (os.getpid(), parent)
    if armed:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="cachekit-watchdog").start()
