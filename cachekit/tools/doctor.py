"""``cachekit doctor``: is training waiting for data? Measure it, then say what to change and why.

It runs the loader for some steps against a simulated step or a real model, and times how long
each ``next(batch)`` waited: the share of time spent waiting is the stall, what a person reads off
low GPU utilisation. Then it measures before it advises: bytes the loader processes read from
storage and their major page faults (is the disk the limit, or is the cache in the page cache?),
CPU time of the training process, its loader thread and each worker (is reading or decoding the
limit?) and, with CUDA and nvidia-ml-py, GPU utilisation.

The simulated step (``DEFAULT_STEP_MS`` = 100 ms unless ``--step-ms``) is ``busy`` by default: a
Python loop that holds the GIL the way an eager PyTorch step does while it launches kernels, the
hard case for a loader thread in the same process. ``sleep`` waits with the GIL released, as a
step blocked on the GPU does: the easy case, which flatters an in-process loader.
"""

from __future__ import annotations

import importlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..augment.spec import parse_spec
from ..constants import DEFAULT_STEP_MS
from ..errors import UsageError
from ..feed.dataset import CachedDataset
from ..feed.loader import make_loader
from .advice import advise
from .benchview import check_outputs
from .counters import ProcessCounters, child_pids
from .doctorloop import WARMUP, GpuSampler, StepTimes, time_steps
from .doctorplot import plot_report
from .report import human_bytes
from .trace import TraceProbe, check_trace_path

__all__ = ["DoctorReport", "STEP_KINDS", "diagnose", "load_model", "simulated_step", "child_pids"]

#: Simulated step kinds and what each stands for.
STEP_KINDS = {
    "busy": "holds the GIL, like a Python-heavy eager training step",
    "sleep": "waits with the GIL released, like a step blocked on the GPU",
}


@dataclass
class DoctorReport:
    cache: str
    batch_size: int
    steps: int
    mode: str
    workers: int
    prefetch_factor: int
    pin_memory: bool
    first_batch_s: float
    wait_s: list[float]
    step_s: list[float]
    cpu_percent: dict[str, float]  # per loader process (and the loader thread), % of one core
    step: str = ""  # what each step was: a simulated one, or the model
    step_kind: str | None = None  # "busy" or "sleep" for a simulated step
    disk_read_bytes: int | None = None  # read from storage during the timed steps, all loader processes
    major_faults: int | None = None
    batch_bytes: int = 0  # cache bytes the timed batches held (stored size)
    gpu: dict | None = None
    recommendations: list[str] = field(default_factory=list)
    #: When each timed step began waiting, in seconds from the first one's start (the timeline).
    start_s: list[float] = field(default_factory=list)
    #: (seconds from the first timed step, GPU utilisation %), sampled by NVML; None without it.
    gpu_trace: list[tuple[float, float]] | None = None
    #: Batches in one pass over the loader (a new pass starts its reads anew).
    epoch_batches: int = 0
    #: With a trace: each loader stage's own seconds over the timed steps, the costliest first.
    stages: dict[str, float] | None = None
    #: The profiler trace written (``trace=``), or None.
    trace: str | None = None

    @property
    def stall(self) -> float:
        waited, worked = sum(self.wait_s), sum(self.step_s)
        return waited / (waited + worked) if waited + worked > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        total = sum(self.wait_s) + sum(self.step_s)
        return len(self.wait_s) * self.batch_size / total if total > 0 else 0.0

    @property
    def disk_share(self) -> float | None:
        """Bytes read from storage per byte of batches delivered; None where not measurable."""
        if self.disk_read_bytes is None or self.batch_bytes <= 0:
            return None
        return self.disk_read_bytes / self.batch_bytes

    def to_json(self) -> dict:
        return {
            "cache": self.cache,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "step": self.step,
            "step_kind": self.step_kind,
            "mode": self.mode,
            "workers": self.workers,
            "prefetch_factor": self.prefetch_factor,
            "pin_memory": self.pin_memory,
            "first_batch_s": self.first_batch_s,
            "stall": self.stall,
            "samples_per_s": self.samples_per_s,
            "wait_ms_median": 1e3 * statistics.median(self.wait_s) if self.wait_s else 0.0,
            "wait_ms_max": 1e3 * max(self.wait_s, default=0.0),
            "step_ms_median": 1e3 * statistics.median(self.step_s) if self.step_s else 0.0,
            "cpu_percent": self.cpu_percent,
            "disk_read_bytes": self.disk_read_bytes,
            "major_faults": self.major_faults,
            "batch_bytes": self.batch_bytes,
            "gpu": self.gpu,
            "recommendations": self.recommendations,
            "stages": self.stages,
            "trace": self.trace,
            "timeline": {
                "start_s": self.start_s,
                "wait_s": self.wait_s,
                "step_s": self.step_s,
                "gpu_utilisation": self.gpu_trace,
            },
        }

    def plot(self, path: str | os.PathLike) -> str:
        """Draw the timed steps (each step's wait against its compute over time, GPU utilisation where
        measured, the verdict) as a PNG at ``path``; needs matplotlib (the ``[plot]`` extra)."""
        return str(plot_report(self, path))

    def _disk_line(self) -> str:
        if self.disk_read_bytes is None:
            faults = f"{self.major_faults} major page faults; " if self.major_faults is not None else ""
            return f"{faults}bytes read from storage not measurable here (no /proc/PID/io)"
        share = self.disk_share or 0.0
        return (
            f"{human_bytes(self.disk_read_bytes)} read from storage ({share:.0%} of the "
            f"{human_bytes(self.batch_bytes)} in the batches), {self.major_faults} major page faults"
        )

    def summary(self) -> str:
        j = self.to_json()
        lines = [
            f"loader:      {self.mode}, batch {self.batch_size}, prefetch_factor {self.prefetch_factor}, "
            f"pin_memory={self.pin_memory}",
            f"step:        {self.step}",
            f"steps:       {self.steps} ({WARMUP} warm-up not counted); first batch after {self.first_batch_s:.2f} s",
            f"waiting:     {self.stall:.0%} of the time (median {j['wait_ms_median']:.1f} ms, "
            f"max {j['wait_ms_max']:.1f} ms per batch; step median {j['step_ms_median']:.1f} ms)",
            f"throughput:  {self.samples_per_s:,.0f} samples/s",
            "cpu:         " + ", ".join(f"{k} {v:.0f}%" for k, v in self.cpu_percent.items()),
            f"disk:        {self._disk_line()}",
        ]
        if self.gpu:
            lines.append(
                f"gpu:         {self.gpu['utilisation_percent']:.0f}% busy, "
                f"{self.gpu['memory_used_bytes'] / 1e9:.1f} GB used"
            )
        if self.stages:
            total = sum(self.stages.values()) or 1.0
            costliest = next(iter(self.stages))
            lines.append(
                "stages:      " + ", ".join(f"{k} {_seconds(v)} ({v / total:.0%})" for k, v in self.stages.items())
                + f" of the loader's time in all its threads and processes; the most: {costliest}"
            )
        if self.trace:
            lines.append(f"trace:       {self.trace} (Chrome's trace viewer, Perfetto or TensorBoard opens it)")
        lines.append("advice:")
        lines += [f"  - {r}" for r in self.recommendations]
        return "\n".join(lines)


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.1f} ms"


def load_model(spec: str) -> Callable[[], torch.nn.Module]:
    """``"package.module:function"`` -> the function, which builds the model to time.

    The module is looked up in the current folder first, as ``python -m`` does (an installed
    ``cachekit`` command does not put the current folder on ``sys.path`` by itself).
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"--model must be MODULE:FUNCTION, got {spec!r}")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--model {spec}: {exc} (looked in {here} and the installed packages)") from None
    if not callable(fn):
        raise UsageError(f"--model {spec}: {name} is not a function")
    return fn


def simulated_step(step_ms: float, kind: str = "busy") -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A stand-in training step of ``step_ms`` milliseconds; ``kind`` is one of ``STEP_KINDS``."""
    if kind not in STEP_KINDS:
        raise UsageError(f"--step-kind must be one of {', '.join(STEP_KINDS)}, got {kind!r}")
    if not (isinstance(step_ms, (int, float)) and math.isfinite(step_ms) and step_ms >= 0):
        raise UsageError(f"--step-ms must be a number of milliseconds >= 0, got {step_ms!r}")
    seconds = step_ms / 1e3
    if kind == "sleep":

        def step(images: torch.Tensor, labels: torch.Tensor) -> None:
            time.sleep(seconds)  # the host waits; the GIL and the CPUs are free for the loader

        return step

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        # Python bytecode until the time is up: the GIL is handed to other threads only at the
        # interpreter's switch interval, as in a step that spends its time in Python
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return step


def _model_step(model: Callable[[], torch.nn.Module], target: torch.device):
    net = model().to(target).train()
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step(images, labels):
        out = net(images.to(target, non_blocking=True).float().div_(255))
        loss = (
            out.float().mean()
            if out.ndim != 2
            else torch.nn.functional.cross_entropy(out.float(), labels.to(target).clamp(0, out.shape[1] - 1))
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if target.type == "cuda":
            torch.cuda.synchronize(target)

    return step


def _total(counters: list[ProcessCounters], key: str) -> int | None:
    values = [getattr(c, key) for c in counters]
    return None if not values or any(v is None for v in values) else sum(values)


def _step_for(
    model, step_ms: float | None, step_kind: str, target: torch.device
) -> tuple[Callable, str, str | None]:
    """The step to time, what it is in words, and its kind (None for a model)."""
    if model is not None:
        name = f"{getattr(model, '__module__', '?')}:{getattr(model, '__qualname__', repr(model))}"
        return _model_step(model, target), f"model {name}, trained on {target}", None
    step_ms = DEFAULT_STEP_MS if step_ms is None else step_ms
    step = simulated_step(step_ms, step_kind)
    return step, f"simulated {step_ms:g} ms, {step_kind} ({STEP_KINDS[step_kind]})", step_kind


def _augment_of(augment: list | str | None) -> list | None:
    """The training run's transforms: a list as given, or a spec parsed (never evaluated), refused in one line."""
    if not isinstance(augment, str):
        return augment
    try:
        return parse_spec(augment) or None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _loader_for(dataset: CachedDataset, batch_size: int, augment, **options):
    """``make_loader`` as training would call it, an augment this cache cannot take refused in one line."""
    try:  # samples of their own sizes come padded, as a training loop without crops reads them
        pad = bool(getattr(dataset, "ragged", False)) and not augment
        return make_loader(dataset, batch_size, pad=pad, augment=augment, **options)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


def _cpu_percent(loader, timed: StepTimes) -> dict[str, float]:
    """Per loader process (and the loader thread), % of one core over the timed steps."""
    used, wall, me = timed.used, timed.wall_s, os.getpid()
    cpu = {"main process": 100 * used[me].cpu_s / wall}
    if loader.num_workers == 0 and getattr(loader, "prefetch_thread", 0):
        cpu["loader thread"] = 100 * max(0.0, used[me].cpu_s - timed.main_thread_cpu_s) / wall
    for i, pid in enumerate(p for p in used if p != me):
        cpu[f"worker {i}"] = 100 * used[pid].cpu_s / wall
    return cpu


def diagnose(
    cache: str | os.PathLike | CachedDataset,
    *,
    batch_size: int = 256,
    steps: int = 50,
    step_ms: float | None = None,
    step_kind: str = "busy",
    model: Callable[[], torch.nn.Module] | None = None,
    workers: int | None = None,
    prefetch_factor: int = 2,
    pin_memory: bool | None = None,
    device: str | None = None,
    storage_options: dict | None = None,
    augment: list | str | None = None,
    plot: str | os.PathLike | None = None,
    trace: str | os.PathLike | None = None,
) -> DoctorReport:
    """Run ``steps`` training steps on the cache's loader and report where the time went.

    Each step is ``model``'s (built by calling it, trained with SGD) or, without a model, a
    simulated step of ``step_ms`` (default ``DEFAULT_STEP_MS``) of ``step_kind`` (``"busy"`` holds
    the GIL, ``"sleep"`` releases it). A URL cache is reached with ``storage_options``. ``augment``:
    the training run's ``cachekit.transforms`` (a list, or a spec such as ``"RandomResizedCrop(224),
    RandomHorizontalFlip()"``), so that the loader timed does the work training asks of it.
    ``plot``: a PNG to draw the timed steps into (``DoctorReport.plot``), checked before the run.
    ``trace``: a Chrome trace file to write, the timed steps run under ``torch.profiler`` with the
    loader's stages in it (``tools.trace``); ``DoctorReport.stages`` then says what each cost.
    """
    if plot is not None:
        check_outputs(None, os.fspath(plot))  # matplotlib there and the file writable, before any work
    if trace is not None:
        trace = check_trace_path(trace)
    augment = _augment_of(augment)
    if model is not None and step_ms is not None:
        raise UsageError("give a simulated step time (--step-ms) or a model (--model), not both")
    if steps < 1 or batch_size < 1:
        raise UsageError("--steps and --batch-size must be at least 1")
    dataset = (
        cache if isinstance(cache, CachedDataset) else CachedDataset(cache, storage_options=storage_options)
    )
    cuda = torch.cuda.is_available()
    target = torch.device(device or ("cuda" if cuda else "cpu"))
    if model is None:  # a bad simulated step is refused before the loader starts
        step, described, step_kind = _step_for(None, step_ms, step_kind, target)
    loader = _loader_for(
        dataset, batch_size, augment, workers=workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
        profile=trace is not None,
    )  # fmt: skip
    if model is not None:
        step, described, step_kind = _step_for(model, step_ms, step_kind, target)
    gpu = GpuSampler(target.index or 0) if target.type == "cuda" else None
    tracer = TraceProbe(loader, trace) if trace is not None else None
    timed = time_steps(loader, step, steps, probes=[p for p in (gpu, tracer) if p is not None])
    used, manifest = list(timed.used.values()), dataset.manifest
    report = DoctorReport(
        cache=dataset.url or str(dataset.root),
        batch_size=batch_size,
        steps=steps,
        mode=loader.mode,
        workers=loader.num_workers,
        prefetch_factor=prefetch_factor,
        pin_memory=bool(loader.pin_memory),
        first_batch_s=timed.first_batch_s,
        wait_s=timed.wait_s,
        step_s=timed.step_s,
        start_s=timed.start_s,
        cpu_percent=_cpu_percent(loader, timed),
        step=described,
        step_kind=step_kind,
        disk_read_bytes=_total(used, "read_bytes"),
        major_faults=_total(used, "major_faults"),
        batch_bytes=int(len(timed.wait_s) * batch_size * manifest.total_bytes / max(1, manifest.num_samples)),
        gpu=gpu.result() if gpu else None,
        gpu_trace=gpu.trace if gpu else None,
        epoch_batches=len(loader),
        stages=tracer.stages if tracer else None,
        trace=trace,
    )
    report.recommendations = advise(report, dataset, cuda, augment=augment)
    if plot is not None:
        report.plot(plot)
    return report
