"""A profiler trace with the loader's stages in it: ``cachekit doctor --trace`` and a user's own profiled loop.

torch's profiler records the process and thread that started it; a loader's stages run in its
prefetch thread, its threads over the batch and its worker processes, which that trace never
shows. A loader made with ``profile=True`` times them itself (``feed.stages``); ``add_stages``
writes them into the Chrome trace that ``torch.profiler`` exported, on that trace's own clock (the
wall clock, from its ``baseTimeNanoseconds``), each worker process and thread on its own named row.
Chrome's trace viewer (``chrome://tracing``, Perfetto) and TensorBoard's profiler open the result.

``stage_times`` sums each stage's own time (what it spent outside the stages nested in it) over
every process and thread, so the stage that costs the most is the first.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import socket
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import torch

from ..errors import CachekitError, UsageError
from ..feed.stages import PREFIX, STAGES

__all__ = ["TraceProbe", "add_stages", "check_trace_path", "stage_times", "trace_handler"]


def _events_of(source) -> list[dict]:
    """Stage events from a loader made with ``profile=True`` (drained), or a list of them."""
    return source.stage_events() if hasattr(source, "stage_events") else list(source)


def _read_trace(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            trace = json.load(file)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a Chrome trace torch.profiler wrote ({exc})") from None
    if isinstance(trace, list):  # the bare array form of the format
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise UsageError(f"{path}: not a Chrome trace (no traceEvents)")
    return trace


def _write_trace(path: str, trace: dict) -> None:
    """Write ``trace`` to ``path`` through a temporary file (a failed write leaves the old one)."""
    opener = gzip.open if path.endswith(".gz") else open
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with opener(partial, "wt", encoding="utf-8") as file:
            json.dump(trace, file)
        os.replace(partial, path)
    except OSError as exc:
        if os.path.exists(partial):
            os.remove(partial)
        reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise CachekitError(f"cannot write {path}: {reason}") from None


def _span_us(events: list[dict]) -> tuple[float, float] | None:
    """(first start, last end) of a trace's timed events, in its own microseconds."""
    timed = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), (int, float))]
    if not timed:
        return None
    return min(e["ts"] for e in timed), max(e["ts"] + float(e.get("dur", 0)) for e in timed)


def add_stages(
    trace: str | os.PathLike, loader_or_events, *, window: bool = True, before: float = 0.0
) -> int:
    """Write a profiled loader's stage events into the Chrome trace file ``trace`` (as torch.profiler's
    ``export_chrome_trace`` wrote it; ``.gz`` too). ``loader_or_events``: a loader made with
    ``profile=True`` (its events since the last call are taken) or events it gave. ``window``: only
    the events that overlap the trace's own span, widened at its start by ``before`` times its length
    (the reads ahead of its first steps). Returns how many stage events were added."""
    path = os.fspath(trace)
    data = _read_trace(path)
    events = _events_of(loader_or_events)
    base_us = float(data.get("baseTimeNanoseconds", 0)) / 1e3
    span = _span_us(data["traceEvents"]) if window else None
    if span is not None:
        span = (span[0] - before * (span[1] - span[0]), span[1])
    timed_events, rows = [], set()
    for event in events:
        if event.get("ph") != "X":
            continue
        moved = dict(event, ts=event["ts"] - base_us)
        if span is not None and (moved["ts"] > span[1] or moved["ts"] + moved["dur"] < span[0]):
            continue
        rows.add((moved["pid"], moved["tid"]))
        timed_events.append(moved)
    named = [e for e in events if e.get("ph") == "M" and (e["pid"], e["tid"]) in rows]
    me = os.getpid()
    for pid in sorted({pid for pid, _ in rows} - {me}):
        named.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"cachekit worker {pid}"},
            }
        )
    data["traceEvents"].extend(named + timed_events)
    _write_trace(path, data)
    return len(timed_events)


def stage_times(events: Iterable[dict]) -> dict[str, float]:
    """Seconds of each stage's own time (less the stages nested in it), summed over every process and
    thread, the costliest first; stages that never ran are left out."""
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and str(event.get("name", "")).startswith(PREFIX):
            rows[event["pid"], event["tid"]].append(event)
    own: dict[str, float] = defaultdict(float)
    for row in rows.values():
        row.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_: list[dict] = []  # the enclosing stages, innermost last
        for event in row:
            while open_ and open_[-1]["ts"] + open_[-1]["dur"] <= event["ts"]:
                open_.pop()
            name = event["name"][len(PREFIX) :]
            own[name] += event["dur"] / 1e6
            if open_:
                own[open_[-1]["name"][len(PREFIX) :]] -= event["dur"] / 1e6
            open_.append(event)
    return dict(sorted(((k, max(0.0, v)) for k, v in own.items()), key=lambda kv: -kv[1]))


def check_trace_path(path: str | os.PathLike, flag: str = "--trace") -> str:
    """``path`` if a trace can be written there (a file is made there and removed, so that what the
    permissions do not say, a read-only or special file system, is found too), else one line,
    before any work."""
    target = os.fspath(path)
    if not target or target.endswith(os.sep) or os.path.isdir(target):
        raise UsageError(f"{flag} {target!r}: give a file name (a folder is not one)")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {target}: its folder does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".cachekit-trace-"):
            pass
        if os.path.exists(target) and not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as exc:
        raise UsageError(f"{flag} {target}: not writable ({exc.strerror or exc})") from None
    return target


def trace_handler(loader, dir_name: str | os.PathLike, worker_name: str | None = None) -> Callable:
    """An ``on_trace_ready`` for ``torch.profiler.profile``: what ``tensorboard_trace_handler(dir_name)``
    writes (``{worker_name}.{ms}.pt.trace.json``, which TensorBoard's profiler reads), with the
    stages of ``loader`` (made with ``profile=True``) added to it: those of the profiled steps, and
    those that ran in as long again before them (the reads ahead that made their batches ran in the
    steps the schedule waited or warmed up in), where they ran."""
    folder = os.fspath(dir_name)
    name = worker_name or f"{socket.gethostname()}_{os.getpid()}"

    def handle(prof) -> None:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{name}.{time.time_ns() // 1_000_000}.pt.trace.json")
        prof.export_chrome_trace(path)
        add_stages(path, loader, before=1.0)

    return handle


class TraceProbe:
    """``doctor``'s profiler: the timed steps under ``torch.profiler`` (CPU, and CUDA where there is
    one), each step's wait and compute as ranges of their own, the loader's stages added, the trace
    written to ``path``; ``stages`` then holds ``stage_times`` of the timed steps.

    The profiler starts in ``prepare``, between the last warm-up step and the first timed one: its
    start takes a second or two, which no timed step may count."""

    def __init__(self, loader, path: str) -> None:
        self.loader, self.path = loader, path
        self.stages: dict[str, float] = {}
        self._steps: list[dict] = []
        self._profiler = None
        self._wall_minus_perf = 0.0
        self._window_us = [0.0, 0.0]

    def prepare(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.__enter__()

    def begin(self, origin: float) -> None:
        self._wall_minus_perf = time.time() - time.perf_counter()
        self._window_us = [(origin + self._wall_minus_perf) * 1e6, float("inf")]  # not the warm-up's

    def step(self, index: int, start: float, got: float, done: float) -> None:
        for name, lo, hi in (("wait for data", start, got), ("step", got, done)):
            ts = (lo + self._wall_minus_perf) * 1e6
            self._steps.append(
                {"ph": "X", "cat": "cachekit", "name": f"{PREFIX}{name}", "pid": os.getpid(),
                 "tid": threading.main_thread().native_id, "ts": ts, "dur": (hi - lo) * 1e6, "args": {"step": index}}
            )  # fmt: skip

    def end(self) -> None:
        self._profiler.__exit__(None, None, None)
        self._window_us[1] = time.time() * 1e6
        lo, hi = self._window_us
        events = [e for e in self.loader.stage_events() if e["ph"] == "M" or lo <= e["ts"] <= hi]
        self.stages = stage_times(e for e in events if e.get("name", "").removeprefix(PREFIX) in STAGES)
        self._profiler.export_chrome_trace(self.path)
        if not os.path.isfile(self.path):  # torch's export says nothing when it cannot write
            raise CachekitError(f"cannot write {self.path}: torch.profiler wrote no trace there")
        add_stages(self.path, events + self._steps, window=False)
