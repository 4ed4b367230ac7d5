"""What ``cachekit doctor`` advises, derived only from what it measured in a run.

The stall says whether training waits; bytes read from storage say whether the disk is why (a
warm page cache reads nothing, a cold one about every byte the batches hold); CPU time of the
loader thread and each worker says whether reading or decoding is. No advice blames a resource
that was not measured busy.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from ..cpus import available_cpus
from ..feed.dataset import CachedDataset
from ..feed.loader import suggest_num_workers
from .report import human_bytes

if TYPE_CHECKING:
    from .doctor import DoctorReport

__all__ = ["advise", "STALL_OK", "DISK_SHARE", "BUSY_PERCENT"]

#: Under this share of time waiting, data keeps up.
STALL_OK = 0.10
#: Bytes read from storage per byte of batches delivered, from which the disk counts as the limit.
DISK_SHARE = 0.2
#: A loader process or thread above this % of one core is busy.
BUSY_PERCENT = 70.0


def _disk_blame(r: DoctorReport) -> str:
    seconds = sum(r.wait_s) + sum(r.step_s)
    rate = r.disk_read_bytes / seconds if seconds > 0 else 0.0
    return (
        f"the disk is the limit: {human_bytes(r.disk_read_bytes)} were read from storage during the "
        f"timed steps ({r.disk_share:.0%} of what the batches held, {human_bytes(rate)}/s, "
        f"{r.major_faults} major page faults): the page cache was cold (a first epoch, or a cache "
        "larger than RAM); put the cache on local NVMe or in RAM (/dev/shm): a cache that fits in "
        "RAM is served from memory after its first epoch"
    )


def _in_process(r: DoctorReport, share: float | None) -> str:
    """Advice for a pixel cache read in the training process when the disk is not the limit."""
    if share is None:
        disk = "bytes read from storage could not be measured here (if this is a first epoch, the disk may be the limit)"
    elif r.disk_read_bytes == 0:
        disk = "nothing was read from storage (the cache is in the page cache)"
    else:
        disk = f"little was read from storage ({human_bytes(r.disk_read_bytes)}, {share:.0%} of the batches)"
    loader = r.cpu_percent.get("loader thread", r.cpu_percent.get("main process", 0.0))
    wait = 1e3 * statistics.median(r.wait_s) if r.wait_s else 0.0
    gil = {
        "busy": "the step holds the GIL, so the loader thread reads only in its gaps; ",
        "sleep": "",
    }.get(
        r.step_kind, "a step that runs Python holds the GIL, and the loader thread reads only in its gaps; "
    )
    n = max(1, suggest_num_workers(r.batch_size))
    return (
        f"{disk}: reading is memory copies in this process ({loader:.0f}% CPU in the loader, median "
        f"wait {wait:.1f} ms per batch); {gil}worker processes read outside this interpreter, in "
        f"parallel: workers={n}"
    )


def _crop_layout(dataset: CachedDataset, augment) -> str | None:
    """A cache of planes read through a crop: the channels-last store reads such crops faster."""
    steps = list(augment or [])
    crops = any(type(step).__name__ in ("RandomResizedCrop", "RandomIoUCrop") for step in steps)
    if not crops or getattr(dataset, "store", None) != "pixels":
        return None
    return (
        "crops from a cache of planes interleave each crop's planes before resizing it: rebuild with "
        "--store pixels-hwc and read with make_loader(channels_last=True) (the same values; crops "
        "written straight into NHWC batches)"
    )


def advise(r: DoctorReport, dataset: CachedDataset, cuda: bool, augment=None) -> list[str]:
    """The recommendations for report ``r`` of a run over ``dataset`` (read through ``augment``'s
    transforms, when given), most important first."""
    cpus = available_cpus()
    heavy = dataset.decode_heavy or dataset.transform is not None
    share = r.disk_share
    from_disk = share is not None and share >= DISK_SHARE
    busy = [v for k, v in r.cpu_percent.items() if k.startswith("worker")]
    advice = []
    if r.stall < STALL_OK:
        advice.append(
            f"data keeps up: {r.stall:.0%} of the time is spent waiting, so the step is the bottleneck; "
            "if memory allows, a larger batch (cachekit.autobatch) uses the device better"
        )
        if from_disk:
            advice.append(
                f"{human_bytes(r.disk_read_bytes)} came from storage (a cold page cache) and data "
                "still kept up"
            )
    else:
        advice.append(f"data bottleneck: training waits for data {r.stall:.0%} of the time")
        if from_disk:
            advice.append(_disk_blame(r))
        elif r.workers == 0 and heavy:
            n = suggest_num_workers(r.batch_size)
            advice.append(
                f"samples need CPU work (a transform or decoding) and run inside the training process: "
                f"use {n} worker processes (workers={n}; suggest_num_workers for {cpus} usable CPUs)"
            )
        elif r.workers == 0:
            advice.append(_in_process(r, share))
            layout = _crop_layout(dataset, augment)
            if layout:
                advice.append(layout)
        elif busy and min(busy) > BUSY_PERCENT and r.workers < cpus:
            advice.append(f"every worker is busy: raise workers from {r.workers} to {cpus} (usable CPUs)")
        elif busy and min(busy) > BUSY_PERCENT:
            advice.append(
                "every CPU is busy decoding: store decoded pixels (a pixel cache needs no workers), "
                "move augmentation offline (cachekit build --augment) or to the GPU, or add CPUs"
            )
        elif not heavy:
            advice.append(
                f"the workers are not busy ({min(busy, default=0):.0f}-{max(busy, default=0):.0f}% CPU) "
                "and the disk is not the limit: handing batches over from worker processes costs more "
                "than reading them; a pixel cache reads fastest in-process (workers=0)"
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
