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
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

__all__ = ["STAGES", "PREFIX", "ROTATE_BYTES", "StageClock", "StageLog", "clock"]

#: Every stage the loader names, and what it covers.
STAGES = {
    "fetch": "the batch's rows located in their shards (on object storage: the shards fetched)",
    "targets": "its boxes, keypoints and other fields read, moved with their pixels and mixed",
    "read": "a sample's stored row copied into the batch (no augmentation)",
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

_NOTHING = contextlib.nullcontext()


class StageClock:
    """Times stages in this process into one ``StageLog`` folder (the loader's)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._pending: collections.deque[list] = collections.deque()  # appended by any thread
        self._named: set[int] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.time_ns()
        try:
            yield
        finally:
            self._pending.append([name, threading.get_native_id(), start, time.time_ns()])

    def flush(self) -> None:
        """Append what this process timed since its last flush to its own file."""
        with self._lock:
            lines = []
            while self._pending:
                name, tid, start, end = self._pending.popleft()
                if tid not in self._named:
                    self._named.add(tid)
                    lines.append(json.dumps(["thread", tid, _thread_name(tid)]))
                lines.append(json.dumps([name, tid, start, end]))
            if lines:
                _append(Path(self.folder), "\n".join(lines) + "\n")


def _thread_name(tid: int) -> str:
    for thread in threading.enumerate():
        if thread.native_id == tid:
            return thread.name
    return f"thread {tid}"


def _append(folder: Path, text: str) -> None:
    """Append to this process's current file, starting a new one (and dropping the one before the
    last) past ``ROTATE_BYTES``. A folder that is gone (the loader closed) takes nothing."""
    pid = os.getpid()
    current = max((int(p.name.split(".")[1]) for p in folder.glob(f"{pid}.*.jsonl")), default=0)
    path = folder / f"{pid}.{current}.jsonl"
    with contextlib.suppress(FileNotFoundError):
        if path.exists() and path.stat().st_size > ROTATE_BYTES:
            (folder / f"{pid}.{current - 1}.jsonl").unlink(missing_ok=True)
            path = folder / f"{pid}.{current + 1}.jsonl"
        with open(path, "a", encoding="utf-8") as file:
            file.write(text)


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
    when the loader is collected or the process exits."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="cachekit-stages-")
        self._read: dict[str, int] = {}
        self._names: dict[tuple[int, int], str] = {}
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.folder, True)

    def events(self) -> list[dict]:
        """Chrome trace events (``"ph": "X"``, ``ts`` and ``dur`` in microseconds on the wall clock
        since the epoch) of the stages timed since the last call, in every process; and a
        ``thread_name`` event for each thread the first time it appears."""
        own = clock(self.folder)  # this process's own stages (the prefetch thread's, the copy's)
        own.flush()
        out: list[dict] = []
        for path in sorted(Path(self.folder).glob("*.jsonl")):
            pid = int(path.name.split(".")[0])
            text = b""
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as file:
                file.seek(self._read.get(path.name, 0))
                text = file.read()
            complete = text[: text.rfind(b"\n") + 1]  # a line still being written waits for the next call
            self._read[path.name] = self._read.get(path.name, 0) + len(complete)
            for line in complete.decode().splitlines():
                out.extend(self._event(pid, json.loads(line)))
        return out

    def _event(self, pid: int, record: list) -> list[dict]:
        if record[0] == "thread":
            _, tid, name = record
            self._names[pid, tid] = name
            return [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}]
        name, tid, start, end = record
        return [
            {
                "ph": "X",
                "cat": "cachekit",
                "name": PREFIX + name,
                "pid": pid,
                "tid": tid,
                "ts": start / 1e3,
                "dur": (end - start) / 1e3,
            }
        ]

    def close(self) -> None:
        self._cleanup()
