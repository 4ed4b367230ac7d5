"""``cachekit doctor``: is training waiting for data? Measure it, then say what to change and why.

It runs the loader for some steps against a simulated step (``step_ms``: the time a GPU step
takes) or a real model, and times how long each ``next(batch)`` waited. The share of time spent
waiting is the stall: what a person reads off low GPU utilisation. CPU time of every loader
process says whether more workers would help; with CUDA and nvidia-ml-py, GPU utilisation too.
"""

from __future__ import annotations

import importlib
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cpus import available_cpus
from ..errors import UsageError
from ..feed.dataset import CachedDataset
from ..feed.loader import make_loader, suggest_num_workers

__all__ = ["DoctorReport", "diagnose", "load_model", "child_pids"]

_STALL_OK = 0.10  # under this share of time waiting, data keeps up
_WARMUP = 2  # steps not counted: worker start-up and first reads are the time to first batch


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
    cpu_percent: dict[str, float]  # per loader process, % of one core
    gpu: dict | None = None
    recommendations: list[str] = field(default_factory=list)

    @property
    def stall(self) -> float:
        waited, worked = sum(self.wait_s), sum(self.step_s)
        return waited / (waited + worked) if waited + worked > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        total = sum(self.wait_s) + sum(self.step_s)
        return len(self.wait_s) * self.batch_size / total if total > 0 else 0.0

    def to_json(self) -> dict:
        return {
            "cache": self.cache,
            "batch_size": self.batch_size,
            "steps": self.steps,
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
            "gpu": self.gpu,
            "recommendations": self.recommendations,
        }

    def summary(self) -> str:
        j = self.to_json()
        lines = [
            f"loader:      {self.mode}, batch {self.batch_size}, prefetch_factor {self.prefetch_factor}, "
            f"pin_memory={self.pin_memory}",
            f"steps:       {self.steps} ({_WARMUP} warm-up not counted); first batch after {self.first_batch_s:.2f} s",
            f"waiting:     {self.stall:.0%} of the time (median {j['wait_ms_median']:.1f} ms, "
            f"max {j['wait_ms_max']:.1f} ms per batch; step median {j['step_ms_median']:.1f} ms)",
            f"throughput:  {self.samples_per_s:,.0f} samples/s",
            "cpu:         " + ", ".join(f"{k} {v:.0f}%" for k, v in self.cpu_percent.items()),
        ]
        if self.gpu:
            lines.append(
                f"gpu:         {self.gpu['utilisation_percent']:.0f}% busy, "
                f"{self.gpu['memory_used_bytes'] / 1e9:.1f} GB used"
            )
        lines.append("advice:")
        lines += [f"  - {r}" for r in self.recommendations]
        return "\n".join(lines)


def load_model(spec: str) -> Callable[[], torch.nn.Module]:
    """``"package.module:function"`` -> the function, which builds the model to time."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"--model must be MODULE:FUNCTION, got {spec!r}")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--model {spec}: {exc}") from None


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (0 where unavailable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child_pids() -> list[int]:
    """Process ids of this process's children (DataLoader workers among them), from /proc."""
    pids = []
    try:
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            pids += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        pass
    return pids


class _GpuSampler:
    """GPU utilisation and memory via NVML, sampled in a thread; inactive without CUDA or pynvml."""

    def __init__(self, device_index: int) -> None:
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nvml = pynvml
        except Exception:
            self._nvml = None
            return
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
            self.samples.append((util.gpu, mem.used))

    def result(self) -> dict | None:
        if self._nvml is None:
            return None
        self._stop.set()
        self._thread.join()
        if not self.samples:
            return None
        return {
            "utilisation_percent": statistics.mean(u for u, _ in self.samples),
            "memory_used_bytes": max(m for _, m in self.samples),
        }


def _advise(r: DoctorReport, dataset: CachedDataset, cuda: bool) -> list[str]:
    cpus = available_cpus()
    heavy = dataset.decode_heavy or dataset.transform is not None
    advice = []
    if r.stall < _STALL_OK:
        advice.append(
            f"data keeps up: {r.stall:.0%} of the time is spent waiting, so the step is the bottleneck; "
            "if memory allows, a larger batch (cachekit.autobatch) uses the device better"
        )
    else:
        advice.append(f"data bottleneck: training waits for data {r.stall:.0%} of the time")
        busy = [v for k, v in r.cpu_percent.items() if k.startswith("worker")]
        if r.workers == 0 and heavy:
            n = suggest_num_workers(r.batch_size)
            advice.append(
                f"samples need CPU work (a transform or decoding) and run inside the training process: "
                f"use {n} worker processes (workers={n}; suggest_num_workers for {cpus} usable CPUs)"
            )
        elif r.workers == 0:
            advice.append(
                "a pixel cache read is a memory copy; if it still cannot keep up, the disk is the limit "
                "(first epoch from a cold page cache?): put the cache on local NVMe or in RAM (/dev/shm)"
            )
        elif r.workers < cpus and busy and min(busy) > 70:
            advice.append(f"every worker is busy: raise workers from {r.workers} to {cpus} (usable CPUs)")
        elif busy and min(busy) > 70:
            advice.append(
                "every CPU is busy decoding: store decoded pixels (a pixel cache needs no workers), "
                "move augmentation offline (cachekit build --augment) or to the GPU, or add CPUs"
            )
        waits = sorted(r.wait_s)
        if r.workers > 0 and len(waits) >= 5 and waits[-1] > 5 * max(statistics.median(waits), 1e-4):
            advice.append(
                f"waits come in bursts (max {1e3 * waits[-1]:.0f} ms vs median "
                f"{1e3 * statistics.median(waits):.1f} ms): raise prefetch_factor from {r.prefetch_factor} "
                f"to {r.prefetch_factor * 2} to smooth them"
            )
    if cuda and not r.pin_memory:
        advice.append("pin_memory=True: page-locked batches copy to the GPU asynchronously")
    return advice


def diagnose(
    cache: str | os.PathLike | CachedDataset,
    *,
    batch_size: int = 256,
    steps: int = 50,
    step_ms: float | None = None,
    model: Callable[[], torch.nn.Module] | None = None,
    workers: int | None = None,
    prefetch_factor: int = 2,
    pin_memory: bool | None = None,
    device: str | None = None,
) -> DoctorReport:
    """Run ``steps`` training steps on the cache's loader and report where the time went."""
    if (step_ms is None) == (model is None):
        raise UsageError("give exactly one of a simulated step time (--step-ms) or a model (--model)")
    if steps < 1 or batch_size < 1:
        raise UsageError("--steps and --batch-size must be at least 1")
    dataset = cache if isinstance(cache, CachedDataset) else CachedDataset(cache)
    cuda = torch.cuda.is_available()
    target = torch.device(device or ("cuda" if cuda else "cpu"))
    others = set(child_pids())  # processes that are not this loader's workers
    loader = make_loader(
        dataset, batch_size, workers=workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor
    )
    step: Callable[[torch.Tensor, torch.Tensor], None]
    if model is not None:
        net = model().to(target).train()
        opt = torch.optim.SGD(net.parameters(), lr=1e-3)

        def step(images, labels):
            out = net(images.to(target, non_blocking=True).float().div_(255))
            loss = (
                out.float().mean()
                if out.ndim != 2
                else torch.nn.functional.cross_entropy(
                    out.float(), labels.to(target).clamp(0, out.shape[1] - 1)
                )
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if target.type == "cuda":
                torch.cuda.synchronize(target)
    else:

        def step(images, labels):
            time.sleep(step_ms / 1e3)  # a GPU step: the host waits, CPUs are free for the loader

    gpu = _GpuSampler(target.index or 0) if target.type == "cuda" else None
    waits, works = [], []
    start = time.perf_counter()
    first = None
    cpu_before: dict[int, float] = {}
    wall_before = 0.0
    done = 0
    while done < steps + _WARMUP:
        t0 = time.perf_counter()
        for images, labels in loader:
            t1 = time.perf_counter()
            if first is None:
                first = t1 - start
            if done == _WARMUP:
                mine = [os.getpid(), *(p for p in child_pids() if p not in others)]
                cpu_before = {pid: _cpu_seconds(pid) for pid in mine}
                wall_before = t1
            step(images, labels)
            t2 = time.perf_counter()
            if done >= _WARMUP:
                waits.append(t1 - t0)
                works.append(t2 - t1)
            done += 1
            if done >= steps + _WARMUP:
                break
            t0 = time.perf_counter()
    wall = max(time.perf_counter() - wall_before, 1e-9)
    cpu = {}
    for pid in cpu_before:
        name = "main process" if pid == os.getpid() else f"worker {len(cpu)}"
        cpu[name] = 100 * (_cpu_seconds(pid) - cpu_before[pid]) / wall
    report = DoctorReport(
        cache=str(dataset.root),
        batch_size=batch_size,
        steps=steps,
        mode=loader.mode,
        workers=loader.num_workers,
        prefetch_factor=prefetch_factor,
        pin_memory=bool(loader.pin_memory),
        first_batch_s=first or 0.0,
        wait_s=waits,
        step_s=works,
        cpu_percent=cpu,
        gpu=gpu.result() if gpu else None,
    )
    report.recommendations = _advise(report, dataset, cuda)
    return report
