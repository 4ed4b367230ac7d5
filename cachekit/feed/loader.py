"""``make_loader``: a real DataLoader over a cache, in the fastest honest mode for that cache.

A pixel read is a memory copy and CPU work (decoding an encoded store, cropping, flipping,
colour) runs in OpenCV, which releases the GIL: so batches are read in this process, by threads
over the batch writing into recycled buffers, one batch ahead in a background thread, and worker
processes (every batch copied into shared memory and out again) are kept for per-sample Python
transforms and codecs whose library serialises (HDF5's gzip, lzf). With a CUDA device, random
crops, flips and colour run on the GPU as one batched kernel after a side-stream copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ..image.geometry import DEFAULT_MIN_VISIBILITY
from .cacheloader import CacheLoader
from .devicestage import DeviceStage
from .loaderchecks import resolve_seed
from .loaderoptions import LoaderOptions, loader_options, suggest_num_workers, suggest_threads
from .sampler import ShardAwareDistributedSampler
from .workers import worker_init

__all__ = ["CacheLoader", "make_loader", "suggest_num_workers", "suggest_threads", "resolve_seed"]

log = logging.getLogger("cachekit")


def make_loader(
    dataset, batch_size: int, shuffle: bool = True, workers: int | None = None, pin_memory: bool | None = None,
    prefetch_factor: int = 2, distributed: bool | None = None, drop_last: bool = False, *,
    seed: int | None = None, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
    normalize: bool = False, prefetch_thread: bool | None = None, pad: bool = False,
    augment: list | Callable[[int], list | None] | None = None, augment_on: str = "auto",
    min_visibility: float = DEFAULT_MIN_VISIBILITY, collate: str = "auto", threads: int | None = None,
    channels_last: bool = False, window: int | None = None, partitions: int | None = None,
    multiprocessing_context=None, storage_options: dict | None = None, split: str | None = None,
    timeout: float | None = None, profile: bool = False,
) -> CacheLoader:  # fmt: skip
    """A DataLoader for ``dataset`` (a CachedDataset, or a cache's path or URL, opened with ``storage_options``;
    ``split``: one split's cache of a folder of split caches) with sampler, reading mode and pinning chosen.

    - Shuffling: ``ShardAwareDistributedSampler`` (class-mixed, a new order every pass; ``window`` samples
      shuffled together, default per the cache; ``partitions``: fixed shard sets per node, default one per node
      for caches on object storage), over this rank's share when ``distributed`` (default: a process group is
      initialised).
    - ``augment``: ``cachekit.transforms`` run per batch, each sample's draws from (``seed``, epoch, index); on
      the GPU when ``device`` is CUDA (``augment_on="auto"``), else by ``threads`` threads (default: this rank's
      share of the CPUs) in this process. Boxes and masks move with the pixels; a box keeping less than
      ``min_visibility`` of its area is dropped. A function ``augment(epoch) -> list`` gives each epoch its own
      list; ``loader.set_augment([...])`` changes it from the next epoch on (both kept by ``state_dict`` for an
      exact resume).
    - ``seed`` (default: from ``torch.initial_seed()``, so ``torch.manual_seed`` sets it; the same on every
      rank, broadcast from rank 0): the shuffle's and the augmentation's.
    - Targets: the class (``labels [B]``) for classification caches; for caches with fields a list of
      per-sample dicts when a field varies in size (boxes), else a dict of stacked tensors (masks);
      ``collate="yolo"``: Ultralytics' ``[M, 6]`` rows (image, class, cx, cy, w, h).
    - ``workers`` (default 0: in-process reads with a prefetch thread; ``suggest_num_workers`` for per-sample
      ``transform=`` functions and codecs that decode serially). Worker processes hand batches over through
      /dev/shm: when it is too small for them (a container's 64 MB), chosen workers give way to in-process
      reads with a warning, and asked-for ones are refused in one line (``ShmTooSmall``) naming
      ``--shm-size`` / ``--ipc=host``.
    - ``pin_memory`` (default: CUDA is available and batches go to it).
    - ``device``: batches are moved there (side stream on CUDA); ``dtype`` (a float type) scales uint8 to
      [0, 1] there, ``normalize`` applies the cache's mean/std in fp32 (default dtype float32),
      ``channels_last`` sets that memory format (crops, resizes and flips on the CPU threads write it as they
      read: fastest from a ``--store pixels-hwc`` cache). ``pad``: variable-sized samples zero-padded to the
      batch's largest, as ``(images, labels, sizes)``; an ``augment`` ending in a fixed size needs no padding.
    - Worker processes start as torch's DataLoader starts them on Linux, by fork (no main guard needed;
      ``multiprocessing_context`` to choose), and end with this process however it ends; one that dies is
      named within a second or so (``WorkerExited``). ``timeout`` (default ``READ_TIMEOUT_SECONDS``, 600): the
      longest a pass waits for one batch, worker processes' handover included, then ``ReadTimeout`` (stuck
      workers are killed; the next pass starts anew). ``profile``: every stage timed where it runs, for
      ``cachekit.add_stages`` to lay over a torch.profiler trace (``feed.stages``).
    """
    options = loader_options(
        dataset, batch_size, shuffle=shuffle, workers=workers, pin_memory=pin_memory,
        prefetch_factor=prefetch_factor, distributed=distributed, drop_last=drop_last, seed=seed, device=device,
        dtype=dtype, normalize=normalize, prefetch_thread=prefetch_thread, pad=pad, augment=augment,
        augment_on=augment_on, min_visibility=min_visibility, collate=collate, threads=threads,
        channels_last=channels_last, window=window, partitions=partitions,
        multiprocessing_context=multiprocessing_context, storage_options=storage_options, split=split,
        timeout=timeout, profile=profile,
    )  # fmt: skip
    sampler = _make_sampler(options)
    loader = _construct_loader(options, sampler, _device_stage(options), _mode_text(options))
    _say_chosen(loader, options)
    return loader


def _make_sampler(options: LoaderOptions) -> ShardAwareDistributedSampler:
    """The loader's sampler over this rank's share (a ``DistributedSampler``: trainers that shard a
    loader see it is sharded already), refused where a batch over its blocks would pin more shards than the
    node cache holds (a cache on object storage)."""
    o, dataset = options, options.dataset
    sampler = ShardAwareDistributedSampler(
        dataset,
        num_replicas=o.world,
        rank=o.rank,
        shuffle=o.shuffle,
        seed=o.seed,
        drop_last=o.drop_last and o.distributed,
        window=o.window,
        partitions=o.partitions,
        group_spread=o.batch_size,  # an input's augmented variants never share a batch
    )
    sampler.seed_chosen = o.seed_chosen
    if hasattr(dataset, "check_batch_shards"):
        dataset.check_batch_shards(
            o.batch_size, sampler.window, o.processes, world=o.world, partitions=sampler.partitions
        )
    return sampler


def _device_stage(options: LoaderOptions) -> DeviceStage:
    """What is done to a batch on its device: the move, the dtype, the cache's mean/std, the memory format."""
    mean = std = None
    if options.normalize:
        dataset = options.dataset
        mean, std = getattr(dataset, "normalization", None) or (dataset.manifest.mean, dataset.manifest.std)
    return DeviceStage(
        options.device, dtype=options.dtype, mean=mean, std=std, channels_last=options.channels_last,
        stages=options.stages.folder if options.stages else None,
    )  # fmt: skip


def _mode_text(options: LoaderOptions) -> str:
    """How the loader reads, in words (``loader.mode``, and ``make_loader``'s log line)."""
    o = options
    if o.workers > 0:
        mode = f"{o.workers} worker processes"
    else:
        mode = "in-process batched reads" + (" + prefetch thread" if o.prefetch_thread else "")
        if o.threads > 1:
            mode += f", {o.threads} threads over each batch"
    if o.schedule is not None and o.schedule.scheduled:
        mode += "; augment a function of the epoch"
    if o.plan is not None:
        mode += f"; augment on {o.device}" if o.on_device else "; augment on CPU threads"
    return mode


def _request_options(options: LoaderOptions) -> dict | None:
    """What each batch request of a CachedDataset carries (``BatchRequest``'s fields; ``on_device_for``
    chooses where each epoch's plan runs), None for another dataset."""
    if not options.readable:
        return None
    return {
        "seed": options.seed,
        "plan": options.plan,
        "threads": options.threads,
        "on_device": options.on_device,
        "on_device_for": options.checks.on_device,
        "channels_last": options.channels_last,
        "timeout": options.timeout,
        "stages": options.stages.folder if options.stages else None,
    }


def _construct_loader(
    options: LoaderOptions, sampler: ShardAwareDistributedSampler, stage: DeviceStage, mode: str
) -> CacheLoader:
    """The ``CacheLoader``, refused in one line where this rank would get no batches."""
    o = options
    extra = {}
    if o.workers > 0:  # waits bounded by timeout= in the loader's own iterator (workers.WorkerBatches)
        extra = {"persistent_workers": True, "prefetch_factor": o.prefetch_factor}
        extra["multiprocessing_context"] = o.context
        extra["worker_init_fn"] = worker_init(o.context)
    loader = CacheLoader(
        o.dataset,
        batch_size=o.batch_size,
        sampler=sampler,
        num_workers=o.workers,
        collate_fn=o.collate_fn,
        pin_memory=o.pin_memory,
        drop_last=o.drop_last,
        prefetch_thread=o.prefetch_factor if (o.prefetch_thread and o.workers == 0) else 0,
        stage=stage,
        requests=_request_options(o),
        mode=mode,
        pad=o.pad,
        schedule=o.schedule,
        read_timeout=o.timeout,
        stage_log=o.stages,
        **extra,
    )
    if len(loader) == 0:
        raise ValueError(
            f"rank {o.rank} of {o.world} would get no batches ({len(sampler)} of {len(o.dataset)} samples, "
            f"batch_size {o.batch_size}, drop_last={o.drop_last}): every rank would skip the epoch; use a "
            "smaller batch_size or drop_last=False"
        )
    return loader


def _say_chosen(loader: CacheLoader, options: LoaderOptions) -> None:
    """One log line of what ``make_loader`` chose: the reading mode, the batch, pinning, the ranks."""
    log.info(
        "make_loader: %s, batch %d, pin_memory=%s, %s",
        loader.mode,
        options.batch_size,
        options.pin_memory,
        f"distributed over {options.world} ranks" if options.distributed else "one process",
    )
