"""What a forked child must not inherit: a lock held by a thread that is not there any more.

A fork copies only the thread that forks. A lock another thread held at that moment stays held in
the child for ever, and a thread pool's threads are gone while the pool believes them there: a
DataLoader worker forked while OpenCV's pool was alive, or while another thread was inside an
OpenCV call, waited for ever in its first OpenCV call (``cv2.calcHist``, about one loader in seven
in a process running cv2 in threads). So, around every fork of this process (``os.fork`` and all
that uses it: torch's DataLoader workers, ``multiprocessing``'s fork, ``subprocess`` is not one):

- cachekit's own threads (the threads over a batch, the prefetch thread) run their OpenCV work
  inside ``working()``: the fork waits for the pieces under way to end (at most
  ``FORK_WAIT_SECONDS``: a piece stuck in a user op holds no OpenCV lock) and new ones wait for
  the fork;
- a module another thread is importing is waited for (at most ``FORK_WAIT_SECONDS``): Python gives
  the child a new global import lock, not the lock of each module being imported, and a worker
  that imports that module (``np.random`` in torch's worker loop, while another thread runs its
  first ``np.random.default_rng``) would wait on it for ever;
- OpenCV's own thread pool is shut down (``cv2.setNumThreads(1)`` joins its threads, after any
  parallel call under way in another thread) and given back its size in the parent afterwards, so
  the child starts with no pool and makes its own if it asks for one.

This keeps PyTorch's way of starting workers on Linux (a fork: no main guard, workers gone with
their parent, started in milliseconds) without its hazard.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["FORK_WAIT_SECONDS", "forked_from_main_thread", "working"]

#: The longest a fork waits for cachekit's threads to finish the pieces of work they are in.
FORK_WAIT_SECONDS = 10.0


class _Gate:
    """Many threads work at once; a fork waits until none is inside, and holds new ones back."""

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.inside = 0
        self.forking = 0
        self.local = threading.local()

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        if getattr(self.local, "depth", 0):  # a piece inside a piece: already counted
            self.local.depth += 1
            try:
                yield
            finally:
                self.local.depth -= 1
            return
        with self.cond:
            while self.forking:
                self.cond.wait()
            self.inside += 1
        self.local.depth = 1
        try:
            yield
        finally:
            self.local.depth = 0
            with self.cond:
                self.inside -= 1
                if not self.inside:
                    self.cond.notify_all()

    def before_fork(self) -> None:
        """Hold new pieces back and wait for those under way, unless this thread is in one (a user
        op that starts a process: waiting for itself would never end)."""
        self.local.held = not getattr(self.local, "depth", 0)
        if not self.local.held:
            return
        with self.cond:
            self.forking += 1
            deadline = time.monotonic() + FORK_WAIT_SECONDS
            while self.inside:
                left = deadline - time.monotonic()
                if left <= 0:
                    break  # a piece stuck in a user op (never in OpenCV, which always returns)
                self.cond.wait(left)

    def after_fork_in_parent(self) -> None:
        if getattr(self.local, "held", False):
            self.local.held = False
            with self.cond:
                self.forking -= 1
                self.cond.notify_all()


_gate = _Gate()

#: OpenCV's thread count before the fork under way, given back to it after (None: left as it was).
_opencv_threads: int | None = None

#: Whether this process was forked by its parent's main thread (set in the parent, read by the child).
_from_main = False


def working():
    """A piece of work that may call OpenCV, in a thread of cachekit's: no fork happens inside it."""
    return _gate.working()


def forked_from_main_thread() -> bool:
    """In a forked child: whether its parent's main thread forked it (then the parent's end is the
    end of that thread, which ``PR_SET_PDEATHSIG`` watches)."""
    return _from_main


def _importing_elsewhere() -> bool:
    """Whether another thread holds the lock of a module it is importing (importlib's own table)."""
    locks = getattr(getattr(importlib, "_bootstrap", None), "_module_locks", None)
    if not isinstance(locks, dict):
        return False
    me = threading.get_ident()
    for ref in list(locks.values()):
        try:
            lock = ref()
        except TypeError:  # not a weak reference: a layout this does not know
            return False
        owner = getattr(lock, "owner", None)
        if owner not in (None, 0, me) and getattr(lock, "count", 1):
            return True
    return False


def _wait_for_imports(deadline: float) -> None:
    while _importing_elsewhere() and time.monotonic() < deadline:
        time.sleep(0.002)  # the GIL goes to the importing thread


def _before() -> None:
    global _opencv_threads, _from_main
    _from_main = threading.current_thread() is threading.main_thread()
    _gate.before_fork()
    _wait_for_imports(time.monotonic() + FORK_WAIT_SECONDS)
    cv2 = sys.modules.get("cv2")
    _opencv_threads = None
    if cv2 is not None and hasattr(cv2, "getNumThreads"):
        threads = cv2.getNumThreads()
        if threads != 1:
            cv2.setNumThreads(1)  # joins the pool's threads: the child has none to wait for
            _opencv_threads = threads


def _after_in_parent() -> None:
    global _opencv_threads
    cv2 = sys.modules.get("cv2")
    if _opencv_threads is not None and cv2 is not None:
        cv2.setNumThreads(_opencv_threads)
    _opencv_threads = None
    _gate.after_fork_in_parent()


def _after_in_child() -> None:
    """A new gate (the old one's lock may have been held by a thread that is gone); OpenCV stays on
    one thread, as the threads over a batch want it."""
    global _gate, _opencv_threads
    _gate = _Gate()
    _opencv_threads = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
