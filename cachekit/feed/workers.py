"""Worker processes that behave like PyTorch's on Linux, with every wait bounded by ``timeout=``.

- They start by fork, as torch's DataLoader starts them on Linux: a script needs no main guard,
  the first batch comes as soon as torch's own, and a notebook's functions reach them.
  ``feed.forking`` makes the fork safe (no lock of OpenCV's held in the child).
- They end with the process that reads the loader, however it ends (SIGTERM, SIGKILL, the
  out-of-memory killer): the kernel kills them, or a thread of theirs sees the parent gone.
- The loader waits for a batch in slices (``CHECK_SECONDS``): a worker that died is named within
  one, and the wait as a whole ends at ``timeout=`` with ``ReadTimeout``, also where a worker is
  stopped halfway through handing a batch over (the shared-memory handover runs in a thread of its
  own, as torch's pin-memory thread runs it); stuck workers are killed then, so that the process
  can exit.
- ``multiprocessing_context="forkserver"`` or ``"spawn"`` run the main script again in each worker:
  without ``if __name__ == "__main__":`` that is one line naming the guard, not a traceback and a wait.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import queue
import re
import signal
import sys
import threading
import time
from pathlib import Path

from torch.utils.data import _utils
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from ..errors import CachekitError
from ..lifetime import die_with_parent
from .forking import forked_from_main_thread
from .safefork import CheckedForkContext
from .timeouts import READ_TIMEOUT_SECONDS, ReadTimeout

__all__ = [
    "CHECK_SECONDS",
    "RERUN",
    "WorkerBatches",
    "WorkerExited",
    "check_not_rerun",
    "rerun_refusal",
    "start_worker",
    "worker_context",
]

#: How often a wait for a batch looks at the workers (torch's own check is every 5 s).
CHECK_SECONDS = 1.0

_GUARD = re.compile(r"""^\s*if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)


class WorkerExited(CachekitError, RuntimeError):
    """A loader's worker process ended while the loader still waited on it (a crash, a kill)."""


def worker_context(explicit):
    """How worker processes start: the ``multiprocessing_context`` the user gave, else fork on Linux
    (as torch's DataLoader there), each worker shown able to use OpenCV before it works
    (``feed.forking``, ``feed.safefork``), else the platform's default."""
    if explicit is not None:
        return explicit
    if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods():
        return CheckedForkContext()
    return None


def method_of(context) -> str:
    """The start method a context (or its name, or None) stands for."""
    if context is None:
        return multiprocessing.get_start_method(allow_none=False)
    return context if isinstance(context, str) else context.get_start_method()


def start_worker(environment: dict[str, str] | None, worker_id: int) -> None:
    """A worker's first act (``worker_init_fn``): end with the process that reads the loader; and,
    started by a forkserver, take that process's environment (``environment``) as it was when the
    loader was made: the server's children inherit the server's, from when the first loader of the
    process started it (credentials or settings set since would be missing)."""
    if environment is not None:
        for name in [name for name in os.environ if name not in environment]:
            del os.environ[name]
        os.environ.update(environment)
    die_with_parent(os.getppid(), kernel=forked_from_main_thread())


def worker_init(context) -> functools.partial:
    """The ``worker_init_fn`` for workers started by ``context``."""
    environment = dict(os.environ) if method_of(context) == "forkserver" else None
    return functools.partial(start_worker, environment)


#: The exit code of a worker started afresh that found itself running the main script again.
RERUN = 76


def rerun_refusal() -> str | None:
    """The line that says this process is a worker started afresh that is running the main script
    again (a script without the main guard, its workers started by forkserver or spawn); None when
    it is not: Python itself sets ``_inheriting`` while such a worker imports the script."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        return _guard_line(method_of(None))
    return None


def check_not_rerun() -> None:
    """End, quietly, a worker started afresh that reached a loader with workers while running the main
    script again: where Python's own refusal is a traceback in each worker, the loader that waits
    for it says the one line (``rerun_refusal``) when it sees it gone with ``RERUN``."""
    if rerun_refusal() is not None:
        os._exit(RERUN)


def _unguarded(main) -> bool:
    """Whether the main script (a file) has no ``if __name__ == "__main__":``."""
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return False
    try:
        return not _GUARD.search(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return False


def _guard_line(method: str) -> str:
    main = getattr(sys.modules.get("__main__"), "__file__", "the script")
    return (
        f"worker processes started by {method} run {os.path.basename(str(main))} again, and it has no "
        "'if __name__ == \"__main__\":': put the code that makes and reads the loader under it, or leave "
        "multiprocessing_context to its default (fork, on Linux)"
    )


class _Handover:
    """A thread that takes the workers' batches off their queue, so that the shared-memory handover
    (the worker passes each tensor's file descriptor over a socket) is never waited on untimed."""

    def __init__(self, source) -> None:
        self.source, self.out = source, queue.Queue()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="cachekit-handover")
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                item = self.source.get(timeout=0.2)
            except queue.Empty:
                continue
            except BaseException as exc:  # a worker gone halfway through a handover
                if not self.done.is_set():
                    self.error = exc
                return
            self.out.put(item)
            del item

    def stop(self) -> None:
        self.done.set()
        if self.thread is not threading.current_thread():
            self.thread.join(1.0)  # one stuck on a stopped worker's socket is left (a daemon)


class WorkerBatches(_MultiProcessingDataLoaderIter):
    """torch's multi-process iterator, its waits bounded by the loader's ``read_timeout`` and its
    workers' deaths named within ``CHECK_SECONDS``."""

    def __init__(self, loader) -> None:
        self._read_timeout = float(getattr(loader, "read_timeout", READ_TIMEOUT_SECONDS))
        self._method = method_of(loader.multiprocessing_context)
        self._handover: _Handover | None = None
        try:
            super().__init__(loader)
        except Exception:  # a forkserver that ran an unguarded script again died with its preload
            if self._method in ("forkserver", "spawn") and _unguarded(sys.modules.get("__main__")):
                raise WorkerExited(f"the loader's worker processes did not start: {_guard_line(self._method)}") from None
            raise
        if not self._pin_memory:  # pinned, torch's pin-memory thread already takes them off
            self._handover = _Handover(self._worker_result_queue)
            self._data_queue = self._handover.out

    def _get_data(self):
        deadline = time.monotonic() + self._read_timeout
        while True:
            handover = self._handover
            if handover is not None and handover.error is not None and handover.out.empty():
                raise self._gone(f"a batch's handover failed ({type(handover.error).__name__}: {handover.error})")
            if self._pin_memory and not self._pin_memory_thread.is_alive():
                raise RuntimeError("Pin memory thread exited unexpectedly")
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._timed_out()
            try:
                success, data = self._try_get_data(min(CHECK_SECONDS, left))
            except RuntimeError as exc:
                if "exited unexpectedly" not in str(exc):
                    raise
                raise self._gone("") from None
            if success:
                return data

    def _gone(self, why: str) -> WorkerExited:
        """A worker died: which, how, and what to do about it, in one line."""
        dead = [(i, w) for i, w in enumerate(self._workers) if not w.is_alive()]
        said = ", ".join(f"worker {i} (pid {w.pid}) {_how(w.exitcode)}" for i, w in dead) or why
        killed = any(w.exitcode == -signal.SIGKILL for _, w in dead)
        self._end()
        if self._method in ("forkserver", "spawn") and _unguarded(sys.modules.get("__main__")):
            return WorkerExited(f"the loader's {said}: {_guard_line(self._method)}")
        hint = (
            ": a kill by SIGKILL is often the out-of-memory killer (fewer workers, a smaller batch_size or "
            "prefetch_factor)"
            if killed
            else ": its own error, if it printed one, is above"
        )
        return WorkerExited(f"the loader's {said}{hint}")

    def _timed_out(self) -> ReadTimeout:
        self._end()
        return ReadTimeout(
            f"no batch came from the loader's {self._num_workers} worker processes (started by {self._method}) "
            f"in {self._read_timeout:g} s: a worker is stuck (storage that does not answer, a lock held for "
            "ever, or a user op that never returns)"
        )

    def _end(self) -> None:
        """Kill the workers (a stopped or stuck one would hold the process's exit) and shut down."""
        if self._worker_pids_set:  # killed by us: not an error for torch's SIGCHLD handler to raise
            _utils.signal_handling._remove_worker_pids(id(self))
            self._worker_pids_set = False
        for w in self._workers:
            if w.is_alive() and w.pid is not None:
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._shutdown_workers()

    def _shutdown_workers(self) -> None:
        handover = getattr(self, "_handover", None)
        if handover is not None:
            handover.stop()
        super()._shutdown_workers()
        if handover is not None and not handover.thread.is_alive():
            self._worker_result_queue.cancel_join_thread()
            self._worker_result_queue.close()


def _how(exitcode: int | None) -> str:
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
