"""Local worker processes for shard jobs: they die with the build, and a crash is one named error.

Every job runs in a child process, even with one worker: a library that crashes the process
(libhdf5 on a full disk) then takes down a worker, not the build, which reports it in one line.
Workers ignore Ctrl-C (the build process handles it and stops them) and are killed by the kernel
if the build process dies first (``PR_SET_PDEATHSIG``), so none is left writing into the cache.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing as mp
import os
import signal
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import wait

from ..constants import START_METHOD_ENV
from ..errors import BuildError, UsageError
from ..lifetime import die_with_parent

__all__ = ["WorkerCrashed", "run_pool", "start_context"]

class WorkerCrashed(BuildError):
    """A worker process died without reporting back (a signal, or a crash inside a library)."""

    def __init__(self, message: str, how: str = "", job: object = None) -> None:
        super().__init__(message)
        self.how, self.job = how, job


def start_context() -> mp.context.BaseContext:
    """How worker processes start: ``CACHEKIT_START_METHOD``, else fork where the OS has it.

    fork starts a pool in milliseconds with every module already imported; forkserver or spawn
    import torch afresh in each worker (~2.5 s measured here), which costs a small build its
    scaling. The parent has touched no OpenMP region when the pool starts (the build only
    decodes in workers), and each worker resets OpenCV's thread pool to one thread.
    """
    method = os.environ.get(START_METHOD_ENV) or ("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    if method not in mp.get_all_start_methods():
        raise UsageError(f"{START_METHOD_ENV}={method!r} is not available here")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["cachekit.build.shardjob"])
    return ctx


def _quiet(log: int | str) -> None:
    """Send this worker's stderr to ``log`` (an inherited descriptor, or a path): libraries' own
    complaints (h5py's "Exception ignored" tracebacks on a full disk, libpng warnings) are not the
    build's output; a crash quotes them."""
    if isinstance(log, int):
        os.dup2(log, 2)
    else:
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
        os.dup2(fd, 2)
        os.close(fd)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # Python's own writes go there too
    sys.unraisablehook = lambda unraisable: None  # errors in destructors: the job's own error says it
    faulthandler.disable()  # a crash is reported by the build process, quoting the library's words


def _worker(conn, fn: Callable, parent: int, log: int | str) -> None:
    """A worker's loop: receive a job, run it, send progress and then its result or error."""
    die_with_parent(parent)
    # Ctrl-C and SIGTERM reach the whole process group; the build process handles them and stops
    # its workers itself (and should it die first, the kernel kills them: die_with_parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _quiet(log)
    conn.send(("ready", None))  # the log is open here: the build process may unlink it
    import cv2

    cv2.setNumThreads(1)  # one core per worker process; the pool provides the parallelism
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            result = fn(job, lambda n: conn.send(("progress", n)))
        except BaseException as exc:  # reported to the build process, which decides
            try:
                conn.send(("error", exc))
            except Exception:  # not picklable: send its text
                conn.send(("error", BuildError(f"{type(exc).__name__}: {exc}")))
            continue
        conn.send(("done", result))


def _signal_name(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


class _Slot:
    """One worker process, its pipe, and its stderr log (an unlinked temp file, read on a crash)."""

    def __init__(self, ctx, fn: Callable) -> None:
        self.log_fd: int | None = None
        self.log_path = os.devnull
        log: int | str = os.devnull
        try:
            if ctx.get_start_method() == "fork":  # the child inherits a file that never had a name
                with tempfile.TemporaryFile(prefix="cachekit-worker-") as fh:
                    self.log_fd = log = os.dup(fh.fileno())
            else:  # a named file, unlinked once the worker has opened it (``ready``)
                self.log_fd, self.log_path = tempfile.mkstemp(prefix="cachekit-worker-", suffix=".log")
                log = self.log_path
        except OSError:  # no room in the temp dir: the worker's complaints go nowhere
            pass
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, fn, os.getpid(), log), daemon=True)
        self.proc.start()
        child.close()
        self.job = None

    def ready(self) -> None:
        """Wait until the worker has opened its log, then unlink it: nothing is left behind, even
        if this process is killed later (the open descriptors keep the file while they live)."""
        try:
            self.conn.recv()
        except (EOFError, OSError):
            pass  # died at start: its sentinel says so
        self.forget_log()

    def forget_log(self) -> None:
        if self.log_path != os.devnull:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self.log_path = os.devnull

    def last_words(self) -> str:
        """The last line the worker wrote to its stderr, if any (a library's last complaint)."""
        if self.log_fd is None:
            return ""
        try:
            size = os.fstat(self.log_fd).st_size
            tail = os.pread(self.log_fd, 4096, max(0, size - 4096))
        except OSError:
            return ""
        lines = [ln.strip() for ln in tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:200] if lines else ""

    def close(self) -> None:
        self.conn.close()
        self.forget_log()
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None


def run_pool(
    fn: Callable, jobs: Sequence, workers: int, on_progress: Callable[[int], None], describe: Callable
) -> Iterator:
    """Run ``fn(job, progress)`` in ``workers`` child processes; yield ``(job, result)`` as they finish.

    A job's exception is re-raised here; a worker that dies mid-job raises WorkerCrashed naming
    ``describe(job)``. However this generator ends (error, Ctrl-C, SIGTERM, close), every worker
    is killed and reaped before it returns.
    """
    ctx = start_context()
    queue = deque(jobs)
    slots: list[_Slot] = []
    try:
        for _ in range(max(1, min(workers, len(queue)))):
            slots.append(_Slot(ctx, fn))
        for slot in slots:
            slot.ready()
            _next(slot, queue)
        while any(slot.job is not None for slot in slots):
            busy = [s for s in slots if s.job is not None]
            ready = set(wait([s.conn for s in busy] + [s.proc.sentinel for s in busy]))
            for slot in busy:
                gone = False  # its end of the pipe closed: the worker died
                while slot.job is not None and slot.conn.poll():
                    try:
                        kind, value = slot.conn.recv()
                    except (EOFError, OSError):
                        gone = True
                        break
                    if kind == "progress":
                        on_progress(value)
                    elif kind == "error":
                        raise value
                    else:
                        job, slot.job = slot.job, None
                        yield job, value
                        _next(slot, queue)
                if slot.job is not None and (gone or (slot.proc.sentinel in ready and not slot.conn.poll())):
                    slot.proc.join(5)
                    words = slot.last_words()
                    how = _signal_name(slot.proc.exitcode)
                    raise WorkerCrashed(
                        f"a worker process died ({how}) while building {describe(slot.job)}"
                        + (f"; its last message: {words}" if words else ""),
                        how,
                        slot.job,
                    )
    finally:
        for slot in slots:
            if slot.proc.is_alive():
                slot.proc.kill()
        for slot in slots:
            slot.proc.join(5)
            slot.close()


def _next(slot: _Slot, queue: deque) -> None:
    if queue:
        slot.job = queue.popleft()
        slot.conn.send(slot.job)
    else:
        slot.job = None
        with contextlib.suppress(OSError):
            slot.conn.send(None)
