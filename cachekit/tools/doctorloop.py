"""The timed steps of ``cachekit doctor``: a loader run against a step, every step's wait and work on one clock.

``time_steps`` runs the loop and records, for each timed step, when it began to wait for its batch,
how long it waited and how long the step took, all from one origin (the first timed step's start),
so that they can be drawn over time as well as summed. Whatever else watches those steps is a
``Probe``: begun at that origin, told of each step, ended after the last. ``GpuSampler`` (NVML
utilisation over time) is one; a profiler trace of the same steps would be another.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from .counters import ProcessCounters, process_counters

__all__ = ["WARMUP", "GpuSampler", "Probe", "StepTimes", "time_steps"]

#: Steps not counted: worker start-up and first reads are the time to first batch.
WARMUP = 2

#: Seconds between two NVML samples.
GPU_EVERY_S = 0.1


class Probe(Protocol):
    """Something that watches the timed steps (all times are ``time.perf_counter()`` seconds)."""

    def prepare(self) -> None:
        """Get ready, between the last warm-up step and the first timed one (what takes time to
        start, a profiler, starts here: no step counts it)."""

    def begin(self, origin: float) -> None:
        """The timed steps start now, at ``origin``."""

    def step(self, index: int, start: float, got: float, done: float) -> None:
        """Timed step ``index`` began waiting at ``start``, had its batch at ``got``, ended at ``done``."""

    def end(self) -> None:
        """The last timed step is over."""


@dataclass
class StepTimes:
    """What ``time_steps`` measured; every list has one entry per timed step, in order."""

    first_batch_s: float
    #: When each timed step began waiting for its batch, in seconds from the first one's start.
    start_s: list[float]
    wait_s: list[float]
    step_s: list[float]
    #: Wall seconds over which the counters ran (from the first timed batch), and this thread's CPU
    #: seconds in them.
    wall_s: float = 0.0
    main_thread_cpu_s: float = 0.0
    #: What each loader process used during the timed steps (this process first, then its workers).
    used: dict[int, ProcessCounters] = field(default_factory=dict)


def time_steps(
    loader, step: Callable, steps: int, *, probes: Iterable[Probe] = (), warmup: int = WARMUP
) -> StepTimes:
    """Run ``warmup + steps`` steps of ``step(images, labels)`` on ``loader``'s batches (passes over
    it repeated as needed) and time the last ``steps``; ``probes`` watch those."""
    probes = list(probes)
    times = StepTimes(first_batch_s=0.0, start_s=[], wait_s=[], step_s=[])
    start = time.perf_counter()
    first = origin = None
    before: dict[int, ProcessCounters] = {}
    thread_before = counted_from = 0.0
    done = 0
    if warmup == 0:
        _prepare(probes)
    while done < steps + warmup:
        t0 = time.perf_counter()
        for images, labels, *_ in loader:  # padded batches also give their samples' sizes
            t1 = time.perf_counter()
            if first is None:
                first = t1 - start
            if done == warmup:  # the counters start after the wait of the first timed step
                before = {pid: process_counters(pid) for pid in [os.getpid(), *loader.worker_pids()]}
                thread_before, counted_from, origin = time.thread_time(), t1, t0
                for probe in probes:
                    probe.begin(origin)
            step(images, labels)
            t2 = time.perf_counter()
            if done >= warmup:
                times.start_s.append(t0 - origin)
                times.wait_s.append(t1 - t0)
                times.step_s.append(t2 - t1)
                for probe in probes:
                    probe.step(done - warmup, t0, t1, t2)
            done += 1
            if done >= steps + warmup:
                break
            if done == warmup:
                _prepare(probes)
            t0 = time.perf_counter()
    for probe in probes:
        probe.end()
    times.first_batch_s = first or 0.0
    times.wall_s = max(time.perf_counter() - (counted_from or start), 1e-9)
    times.main_thread_cpu_s = time.thread_time() - thread_before
    times.used = {pid: process_counters(pid) - was for pid, was in before.items()}
    return times


def _prepare(probes: list) -> None:
    for probe in probes:
        probe.prepare()


class GpuSampler:
    """GPU utilisation and memory via NVML, sampled in a thread from ``begin`` to ``end``; inactive
    without CUDA or nvidia-ml-py (``result()`` and ``trace`` are then None)."""

    def __init__(self, device_index: int) -> None:
        #: (seconds from the origin, utilisation %, memory used in bytes), one per sample.
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._origin = 0.0
        try:  # an optional dependency (the [gpu] extra), and a machine that may have no driver
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def prepare(self) -> None:
        pass  # NVML was opened when made

    def begin(self, origin: float) -> None:
        if self._nvml is None or self._thread is not None:
            return
        self._origin = origin
        self._thread = threading.Thread(target=self._run, daemon=True, name="cachekit-doctor-nvml")
        self._thread.start()

    def step(self, index: int, start: float, got: float, done: float) -> None:
        pass  # sampled by time, not by step

    def end(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def _run(self) -> None:
        while True:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            self.samples.append((time.perf_counter() - self._origin, util.gpu, mem.used))
            if self._stop.wait(GPU_EVERY_S):
                return

    def result(self) -> dict | None:
        """Mean utilisation and peak memory over the timed steps; None where nothing was sampled."""
        if self._nvml is None or not self.samples:
            return None
        return {
            "utilisation_percent": statistics.mean(u for _, u, _ in self.samples),
            "memory_used_bytes": max(m for _, _, m in self.samples),
        }

    @property
    def trace(self) -> list[tuple[float, float]] | None:
        """(seconds from the first timed step, utilisation %) over the timed steps, or None."""
        if self._nvml is None or not self.samples:
            return None
        return [(round(t, 4), float(u)) for t, u, _ in self.samples]
