"""``LoaderOptions``: ``make_loader``'s arguments, every one checked and every "None means auto" resolved,
in one place (``loader_options``), in the order the checks have always run.

Nothing here starts a thread or a process; the seed's broadcast (``distributed``) is the one
collective call, made by every rank at the same point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..augment.plan import Plan
from ..cpus import available_cpus, local_world_size
from ..errors import UsageError
from .batch import Collate
from .devicestage import check_device
from .loaderchecks import (
    PlanCheck,
    batch_bytes,
    check_counts,
    check_plan_pickles,
    check_timeout,
    fit_workers,
    open_dataset,
    resolve_seed,
)
from .order import default_window, node_partitions
from .schedule import AugmentSchedule
from .stages import StageLog
from .targets import check_yolo_collate
from .workers import check_not_rerun, worker_context

__all__ = [
    "LoaderOptions",
    "loader_options",
    "suggest_num_workers",
    "suggest_threads",
    "window_that_fits",
    "SERIAL_CODECS",
]

#: Codecs whose decoding serialises in its library (h5py holds one lock): worker processes pay off.
SERIAL_CODECS = ("gzip", "lzf", "zstd")


def suggest_num_workers(
    batch_size: int, max_workers: int | None = None, world_size: int | None = None
) -> int:
    """``min(cpus // ranks_here, batch_size if batch_size > 1 else 0, max_workers)`` worker processes.

    ``cpus`` is what this process may really use (affinity, capped by the cgroup CPU quota);
    ``world_size`` is how many processes share this node's CPUs (default: ``local_world_size()``:
    ``LOCAL_WORLD_SIZE``, else the GPUs in use here), not the job's global world size.
    """
    ranks = local_world_size() if world_size is None else world_size
    candidates = [available_cpus() // max(ranks, 1), batch_size if batch_size > 1 else 0]
    if max_workers is not None:
        candidates.append(max_workers)
    return max(0, min(candidates))


def suggest_threads(world_size: int | None = None) -> int:
    """Threads over a batch for in-process decoding and augmentation: this rank's share of the CPUs."""
    ranks = local_world_size() if world_size is None else world_size
    return max(1, available_cpus() // max(ranks, 1))


@dataclass(frozen=True, kw_only=True)
class LoaderOptions:
    """What a loader reads with, resolved (``make_loader`` documents each argument)."""

    dataset: Any  #: the dataset (a path or URL opened as a ``CachedDataset``)
    batch_size: int
    shuffle: bool
    drop_last: bool
    prefetch_factor: int
    distributed: bool  #: default: a process group is initialised
    world: int  #: ranks reading (1 unless ``distributed``)
    rank: int
    seed: int  #: default: ``torch.initial_seed()``'s, broadcast from rank 0
    seed_chosen: bool  #: the seed was chosen here (a resumed state's seed is then adopted)
    workers: int  #: worker processes (default: none, unless per-sample transforms or a serial codec)
    context: Any  #: how worker processes start (``workers.worker_context``); None without workers
    threads: int  #: threads over a batch (default: this rank's share of the CPUs; 1 with workers)
    prefetch_thread: bool  #: a prefetch thread reads ahead (default: when there are no workers)
    pin_memory: bool  #: default: CUDA is available and batches go to it
    window: int | None  #: samples shuffled together (None: the sampler's default)
    partitions: int | None
    processes: int  #: reading processes on this node
    timeout: float  #: the longest a pass waits for one batch
    device: torch.device | None
    dtype: torch.dtype | None
    normalize: bool
    channels_last: bool
    pad: bool
    collate_fn: Collate
    readable: bool  #: a CachedDataset: batches are read as requests
    schedule: AugmentSchedule | None  #: each epoch's plan (None: not a CachedDataset)
    plan: Plan | None  #: the first epoch's plan
    on_device: bool  #: the first epoch's plan runs on ``device``
    checks: PlanCheck  #: every later plan's check, and where it runs
    stages: StageLog | None  #: where the loader's processes time their stages (``profile=True``)


def loader_options(
    dataset, batch_size: int, *, shuffle, workers, pin_memory, prefetch_factor, distributed, drop_last, seed,
    device, dtype, normalize, prefetch_thread, pad, augment, augment_on, min_visibility, collate, threads,
    channels_last, window, partitions, multiprocessing_context, storage_options, split, timeout, profile=False,
) -> LoaderOptions:  # fmt: skip
    """``make_loader``'s arguments checked (one line each, before anything starts) and resolved."""
    check_counts(
        batch_size=batch_size, prefetch_factor=prefetch_factor, seed=seed, workers=workers, threads=threads
    )
    timeout = check_timeout(timeout)
    dataset = open_dataset(dataset, storage_options, split)
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    device = check_device(device)
    checks = PlanCheck(dataset, batch_size, pad=pad, augment_on=augment_on, device=device)
    schedule = _schedule(dataset, augment, min_visibility, checks)
    plan = schedule.upcoming(0) if schedule is not None else None  # the first epoch's: sizes workers
    if not isinstance(profile, bool):
        raise TypeError(f"profile must be True or False, got {profile!r}")
    if collate == "yolo":
        check_yolo_collate(getattr(dataset, "fields", {}))
    seed_chosen = seed is None
    seed = resolve_seed(seed, distributed)
    on_device = checks.on_device(plan)
    workers = _workers(dataset, batch_size, workers, plan, checks.per_sample, prefetch_factor)
    context = _worker_start(workers, multiprocessing_context, plan, checks)
    if threads is None:
        threads = 1 if workers > 0 else suggest_threads()
    if prefetch_thread is None:
        prefetch_thread = workers == 0
    if pin_memory is None:
        pin_memory = torch.cuda.is_available() and (device is None or device.type == "cuda")
    processes = local_world_size() * max(1, workers)
    window = _window(dataset, window, batch_size, processes, world, partitions)
    stages = StageLog() if profile else None  # last: nothing refused after its folder is made
    collate_fn = Collate(
        pad=pad, targets=collate, fields=getattr(dataset, "fields", None), stages=stages.folder if stages else None
    )
    return LoaderOptions(
        dataset=dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
        prefetch_factor=prefetch_factor, distributed=distributed, world=world, rank=rank, seed=seed,
        seed_chosen=seed_chosen, workers=workers, context=context, threads=threads,
        prefetch_thread=prefetch_thread, pin_memory=pin_memory, window=window, partitions=partitions,
        processes=processes, timeout=timeout, device=device, dtype=dtype, normalize=normalize,
        channels_last=channels_last, pad=pad, collate_fn=collate_fn, readable=schedule is not None,
        schedule=schedule, plan=plan, on_device=on_device, checks=checks, stages=stages,
    )  # fmt: skip


def _schedule(dataset, augment, min_visibility: float, checks: PlanCheck) -> AugmentSchedule | None:
    """The augmentation of each epoch, for a CachedDataset (its batches are read as requests)."""
    readable = hasattr(dataset, "read_request")
    if not readable and augment is not None:
        raise TypeError("augment needs a cachekit CachedDataset")
    return AugmentSchedule(augment, min_visibility=min_visibility, check=checks) if readable else None


def _workers(dataset, batch_size: int, workers: int | None, plan, per_sample: bool, prefetch_factor: int) -> int:
    """Worker processes: those asked for, or some for per-sample transforms and serial codecs, none
    otherwise; either way fewer (none, or a refusal where asked for) where /dev/shm cannot hold them."""
    codec = getattr(getattr(dataset, "manifest", None), "format_options", {}).get("compression", "none")
    asked = workers is not None
    if workers is None:
        workers = suggest_num_workers(batch_size) if per_sample or codec in SERIAL_CODECS else 0
    return fit_workers(workers, asked, batch_bytes(dataset, batch_size, plan), prefetch_factor)


def _worker_start(workers: int, multiprocessing_context, plan, checks: PlanCheck):
    """How worker processes start: fork on Linux, as torch's DataLoader (the user's context as
    given), None without workers; the plan, and every later one, checked to travel to them."""
    context = None
    if workers > 0:
        check_not_rerun()
        context = worker_context(multiprocessing_context)
    checks.send_to_workers(workers, context)
    if workers > 0:
        check_plan_pickles(plan, context)
    return context


def _window(dataset, window: int | None, batch_size: int, processes: int, world: int, partitions: int | None):
    """``window``, or for a cache read in blocks of shards the node cache holds, the default one that fits."""
    if window is None and callable(getattr(dataset, "block_shards", None)):
        nodes = partitions if partitions is not None else node_partitions(dataset, world, local_world_size())
        default = default_window(dataset, len(dataset), processes, nodes)
        window = window_that_fits(dataset, default, batch_size, processes, world, nodes)
    return window


def window_that_fits(
    dataset, window: int, batch_size: int, processes: int, world: int, partitions: int
) -> int:
    """The default window, or where a batch over its blocks would pin more shards than the node
    cache holds, the largest smaller one that fits, down to blocks of one shard: the shuffle
    shrinks before the loader is refused."""
    check = getattr(dataset, "check_batch_shards", None)
    if check is None:
        return window
    w = int(window)
    while True:
        try:
            check(batch_size, w, processes, world=world, partitions=partitions)
            return w
        except UsageError:
            if w <= 1:
                return window  # nothing fits: the check after the sampler is made says so
            w = max(1, w // 2)
