"""The loader's stages, timed where they run: any process (worker processes too), any thread.

``make_loader(..., profile=True)`` gives the loader a ``StageLog``: a private folder in which every
process that works for the loader appends the stages it ran (a name from ``STAGES``, its process,
its thread, its start and end on the wall clock, nanoseconds), one file per process. The loader's
own process reads them back (``CacheLoader.stage_events``) as Chrome trace events, which
``tools.trace`` lays over a ``torch.profiler`` trace of the same steps: torch's profiler sees
only the threads of the process that started it (a ``record_function`` in the prefetch thread,
a thread over the batch or a worker process is not in its trace), so the loader keeps its own.

The wall clock (``time.time_ns``) is the one torch's profiler writes its trace on, so the two line
up. Without ``profile=True`` nothing is timed: ``clock(None)`` is a no-op context every time.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path

__all__ = ["STAGES", "PREFIX", "ROTATE_BYTES", "StageClock", "StageLog", "clock"]

#: Every stage the loader names, and what it covers.
STAGES = {
    "fetch": "the batch's rows located in their shards (on object storage: the shards fetched)",
    "targets": "its boxes, keypoints and other fields read, moved with their pixels and mixed",
    "read": "a sample's row copied into the batch as it is (stored pixels, or pixels just decoded)",
    "decode": "an encoded sample (JPEG, PNG, a compressed chunk) decoded",
    "augment": "a sample's crop, resize, flip, colour and pixel steps (from a pixel store, the row's "
    "first read from the memory map too)",
    "masks": "a sample's masks decoded and moved",
    "batch_ops": "the batch's own ops and mixes (MixUp, CutMix, a BatchOp) on the CPU",
    "collate": "the batch made into what the training step takes (targets as tensors or dicts)",
    "copy": "the batch to its device and finished there (dtype, normalisation, device augmentation)",
}
#: Trace events are named ``PREFIX + stage``.
PREFIX = "cachekit."
#: A process's file is started afresh past this size (its previous one kept, the one before dropped):
#: a loader profiled for a whole run that nobody reads keeps about the last two of these per process.
ROTATE_BYTES = 8 << 20
#: Events a process holds before it writes them out unasked (it writes each batch's anyway where it
#: reads batches; the loader's own process otherwise only when its events are read).
FLUSH_EVENTS = 1024

_NOTHING = contextlib.nullcontext()


class StageClock:
    """Times stages in this process into one ``StageLog`` folder (the loader's), in a file of its own.

    Profiling never stops a run: a file that cannot be written (a full disk, the folder removed)
    ends this process's timing for the loader, with one warning."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._pending: collections.deque[list] = collections.deque()  # appended by any thread
        self._named: set[int] = set()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._broken = False
        pid = os.getpid()  # a file of its own: never one a process of the same pid left behind
        self._index = 1 + max(
            (int(p.name.split(".")[1]) for p in Path(folder).glob(f"{pid}.*.jsonl")), default=-1
        )

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start, began = time.time_ns(), time.perf_counter_ns()  # the duration on a clock that never steps back
        try:
            yield
        finally:
            if not self._broken:
                self._pending.append([name, threading.get_native_id(), start, time.perf_counter_ns() - began])
                if len(self._pending) > FLUSH_EVENTS:  # a process nobody reads keeps its memory bounded
                    self.flush()

    def flush(self) -> None:
        """Append what this process timed since its last flush to its own file (one write)."""
        with self._lock:
            lines = []
            while self._pending:
                name, tid, start, duration = self._pending.popleft()
                if tid not in self._named:
                    self._named.add(tid)
                    lines.append(json.dumps(["thread", tid, _thread_name(tid)]))
                lines.append(json.dumps([name, tid, start, start + duration]))
            if lines and not self._broken:
                self._write(("\n".join(lines) + "\n").encode())

    def _write(self, data: bytes) -> None:
        try:
            if self._fd is None or self._size > ROTATE_BYTES:
                self._rotate()
            written = os.write(self._fd, data)
            if written < len(data):  # a short write (a full disk): end the line, and stop
                os.write(self._fd, b"\n")
                raise OSError(errno.ENOSPC, "short write")
            self._size += written
        except OSError as exc:
            self._broken = True
            self._pending.clear()
            if not isinstance(exc, FileNotFoundError):  # the folder gone: the loader was closed
                warnings.warn(f"profile=True: the loader's stages are no longer timed in process {os.getpid()}: "
                              f"{exc.strerror or exc}", RuntimeWarning, stacklevel=4)  # fmt: skip

    def _rotate(self) -> None:
        """Start this process's next file; drop the one before the last."""
        folder, pid = Path(self.folder), os.getpid()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            (folder / f"{pid}.{self._index - 1}.jsonl").unlink(missing_ok=True)
            self._index += 1
            self._named.clear()  # each file names its threads
        self._fd = os.open(
            folder / f"{pid}.{self._index}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        self._size = 0

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _thread_name(tid: int) -> str:
    for thread in threading.enumerate():
        if thread.native_id == tid:
            return thread.name
    return f"thread {tid}"


#: This process's clock per folder (a forked worker starts with none of its parent's events).
_clocks: dict[str, StageClock] = {}
_clocks_pid = os.getpid()


def clock(folder: str | None) -> StageClock | None:
    """This process's clock for the loader whose ``StageLog`` is ``folder``; None without one."""
    global _clocks_pid
    if folder is None:
        return None
    if _clocks_pid != os.getpid():
        _clocks.clear()
        _clocks_pid = os.getpid()
    found = _clocks.get(folder)
    if found is None:
        found = _clocks.setdefault(folder, StageClock(folder))
    return found


def timed(stage_clock: StageClock | None, name: str):
    """``stage_clock.stage(name)``, or nothing at all without a clock."""
    return _NOTHING if stage_clock is None else stage_clock.stage(name)


class StageLog:
    """The folder a profiled loader's processes time their stages into, and its reader. Removed
    when the loader is collected or its process exits (never by a child forked from it)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="cachekit-stages-")
        self._read: dict[str, int] = {}
        self._names: dict[tuple[int, int], str] = {}
        self._cleanup = weakref.finalize(self, _remove, self.folder, os.getpid())

    def events(self) -> list[dict]:
        """Chrome trace events (``"ph": "X"``, ``ts`` and ``dur`` in microseconds on the wall clock
        since the epoch) of the stages timed since the last call, in every process, and a
        ``thread_name`` event for each thread they ran in."""
        clock(self.folder).flush()  # this process's own stages (the prefetch thread's, the copy's)
        out: list[dict] = []
        for path in sorted(Path(self.folder).glob("*.jsonl")):
            pid = int(path.name.split(".")[0])
            text = b""
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as file:
                file.seek(self._read.get(path.name, 0))
                text = file.read()
            complete = text[: text.rfind(b"\n") + 1]  # a line still being written waits for the next call
            self._read[path.name] = self._read.get(path.name, 0) + len(complete)
            for line in complete.splitlines():
                out.extend(self._event(pid, line))
        rows = sorted({(e["pid"], e["tid"]) for e in out} & set(self._names))
        named = [
            {"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": self._names[p, t]}}
            for p, t in rows
        ]
        return named + out

    def _event(self, pid: int, line: bytes) -> list[dict]:
        """The event a line records (a thread's name is kept for ``events``); none for a line cut
        short (a process killed while it wrote, a full disk)."""
        try:
            record = json.loads(line)
            if record[0] == "thread":
                self._names[pid, int(record[1])] = str(record[2])
                return []
            name, tid, start, end = record
            event = {"ph": "X", "cat": "cachekit", "name": PREFIX + name, "pid": pid, "tid": int(tid),
                     "ts": start / 1e3, "dur": max(0, end - start) / 1e3}  # fmt: skip
        except (ValueError, TypeError, IndexError, KeyError):
            return []
        return [event]

    def close(self) -> None:
        self._cleanup()


def _remove(folder: str, owner: int) -> None:
    """Remove a loader's stage folder, in the process that made it only, and forget its clock."""
    if os.getpid() != owner:
        return
    found = _clocks.pop(folder, None)
    if found is not None:
        found.close()
    shutil.rmtree(folder, ignore_errors=True)
