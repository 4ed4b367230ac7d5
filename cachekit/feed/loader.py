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
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ..augment.device import DeviceStage, check_device
from ..cpus import available_cpus, local_world_size
from ..errors import UsageError
from ..image.geometry import DEFAULT_MIN_VISIBILITY
from .assemble import BatchRequest
from .batch import Collate
from .loaderchecks import (
    batch_bytes,
    check_augment_plan,
    check_counts,
    check_plan_pickles,
    choose_augment_on,
    fit_workers,
    open_dataset,
    resolve_seed,
)
from .order import default_window, node_partitions
from .prefetch import Prefetcher
from .rows import boxes_field
from .sampler import ShardAwareDistributedSampler
from .schedule import AugmentSchedule
from .targets import check_yolo_collate
from .timeouts import READ_TIMEOUT_SECONDS, ReadTimeout
from .workers import WorkerBatches, WorkerExited, check_not_rerun, worker_context, worker_init

__all__ = ["CacheLoader", "make_loader", "suggest_num_workers", "suggest_threads", "resolve_seed"]

log = logging.getLogger("cachekit")

#: Codecs whose decoding serialises in its library (h5py holds one lock): worker processes pay off.
_SERIAL_CODECS = ("gzip", "lzf", "zstd")


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


class _Requests:
    """Wraps a batch sampler: each batch of indices becomes a ``BatchRequest`` of the current epoch.

    ``options`` is the loader's own dict (read afresh each pass: a resumed seed, a new schedule);
    a pass takes its plan once, at its first batch, from ``schedule`` for the sampler's epoch then,
    and every request of the pass carries that plan.
    """

    def __init__(self, batches, sampler, dataset, options: dict, schedule: AugmentSchedule | None):
        self.batches, self.sampler, self.dataset = batches, sampler, dataset
        self.options, self.schedule = options, schedule

    def __iter__(self) -> Iterator[BatchRequest]:
        first = True
        options = dict(self.options)
        choose = options.pop("on_device_for", None)
        for batch in self.batches:  # the sampler has begun its pass, so its epoch is this pass's
            epoch = getattr(self.sampler, "epoch", 0)
            if first:
                if self.schedule is not None:
                    options["plan"] = self.schedule.plan_for(epoch)
                    options["on_device"] = choose(options["plan"]) if choose else False
                if hasattr(self.dataset, "plan_reads"):  # shards on object storage: fetch ahead
                    following = getattr(self.sampler, "next_indices", None)  # and evict by the order
                    self.dataset.plan_reads(getattr(self.sampler, "last_indices", batch), following)
            first = False
            if hasattr(self.dataset, "reading"):
                self.dataset.reading(batch)
            yield BatchRequest(batch, epoch=epoch, **options)

    def __len__(self) -> int:
        return len(self.batches)


class CacheLoader(DataLoader):
    """A DataLoader that reads ahead in a thread and finishes batches on a device.

    ``mode`` says how it reads. Each pass is the sampler's next epoch (unless ``set_epoch`` said
    otherwise); ``state_dict()`` records how far the current epoch got, from batches delivered.
    """

    def __init__(
        self,
        *args: Any,
        prefetch_thread: int = 0,
        stage: DeviceStage | None = None,
        requests: dict | None = None,
        mode: str = "",
        pad: bool = False,
        schedule: AugmentSchedule | None = None,
        read_timeout: float = READ_TIMEOUT_SECONDS,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.schedule = schedule
        #: The longest a pass waits for one batch (prefetch thread or worker processes).
        self.read_timeout = float(read_timeout)
        self.pad = pad
        self.prefetch_thread = prefetch_thread
        self.stage = stage or DeviceStage()
        self.device = self.stage.device
        self._request_options = requests
        self.mode = mode
        self._delivered = 0
        self._prefetcher: Prefetcher | None = None

    @property
    def _index_sampler(self):
        base = super()._index_sampler
        if self._request_options is None or not self._auto_collation:
            return base
        return _Requests(base, self.sampler, self.dataset, self._request_options, self.schedule)

    def __iter__(self) -> Iterator:
        if self._prefetcher is not None:  # a pass abandoned part-way: stop its reader first
            self._prefetcher.stop(timeout=30)
            self._prefetcher = None
        if self.schedule is not None:  # set_augment takes effect now; a bad plan of the epoch fails here
            upcoming = getattr(self.sampler, "upcoming_epoch", None)
            self.schedule.begin(upcoming() if upcoming else getattr(self.sampler, "epoch", 0))
        self._delivered = 0
        it = super().__iter__()
        if self.num_workers > 0:
            it = _said_in_one_line(it)
        if self.prefetch_thread:
            self._prefetcher = Prefetcher(it, self.prefetch_thread, self.read_timeout)
            it = iter(self._prefetcher)
        try:
            for batch in self.stage.run(it):
                self._delivered += 1
                if self.pad and isinstance(batch, (tuple, list)) and len(batch) == 2:
                    batch = (*batch, _sizes_of(batch[0]))  # pad=True: always (images, labels, sizes)
                yield batch
        except (ReadTimeout, WorkerExited):  # its workers are gone: the next pass starts new ones
            self._iterator = None
            raise

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        return WorkerBatches(self)

    def worker_pids(self) -> list[int]:
        """Process ids of this loader's worker processes, once a pass has started them (a
        forkserver's children, not this process's, where ``multiprocessing_context`` says so)."""
        it = getattr(self, "_iterator", None)  # persistent workers: the DataLoader keeps its iterator
        return [int(w.pid) for w in getattr(it, "_workers", ()) if w.pid is not None]

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (it is the next one by default)."""
        self.sampler.set_epoch(epoch)

    def set_augment(self, augment) -> None:
        """Read with ``augment`` from the next pass on (Ultralytics' ``close_mosaic``: mosaic off for
        the last epochs): a list of ``cachekit.transforms``, None for none, or a function of the
        epoch returning such a list. The pass under way keeps its plan to its last batch, batches
        read ahead included; the list is checked now (one-line errors)."""
        if self.schedule is None:
            raise TypeError("set_augment needs a loader over a cachekit CachedDataset (make_loader)")
        self.schedule.set(augment)

    def augment_for(self, epoch: int):
        """The compiled plan epoch ``epoch`` would read with if its pass began now (None: no augmentation)."""
        return None if self.schedule is None else self.schedule.upcoming(epoch)

    def state_dict(self) -> dict:
        """Resume point of the current epoch, from the batches the loop actually received, with
        the augmentation the epoch reads with (``augment``: as text, see ``cachekit.augment.spec``)."""
        if not isinstance(self.sampler, ShardAwareDistributedSampler):
            raise TypeError("state_dict needs the loader's sampler to be a ShardAwareDistributedSampler")
        state = self.sampler.state_dict(consumed=self._delivered * (self.batch_size or 1))
        if self.schedule is not None:
            state.update(self.schedule.state(not self.sampler.begun(), self.sampler.epoch))
        return state

    def load_state_dict(self, state: dict) -> None:
        """Resume the saved epoch with the plan it read with; a seed chosen for this loader becomes
        the saved job's (its order and crops continue)."""
        if self.schedule is not None:
            self.schedule.check_state(state)  # before the sampler takes any of it
        self.sampler.load_state_dict(state)
        if self._request_options is not None:
            self._request_options["seed"] = self.sampler.seed
        if self.schedule is not None:
            self.schedule.restore(state, new_epoch=self.sampler.epoch != state.get("epoch"))


def _said_in_one_line(batches: Iterator) -> Iterator:
    """A DataLoader's batches, a usage error raised in a worker (an op of the user's that failed on a
    sample) said as its own line, not as the worker's traceback."""
    try:
        yield from batches
    except UsageError as exc:
        lines = str(exc).strip().splitlines()
        if len(lines) < 2 or not lines[0].startswith("Caught "):
            raise
        name = type(exc).__name__
        said = lines[-1].split(f"{name}: ", 1)[-1] if f"{name}: " in lines[-1] else lines[-1]
        raise type(exc)(said) from None


def _sizes_of(images: torch.Tensor) -> torch.Tensor:
    """``[B, 2]`` heights and widths of a batch whose images all have its size."""
    return torch.tensor(list(images.shape[-2:]), dtype=torch.int64).expand(images.shape[0], 2).contiguous()


def _window_that_fits(
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


def make_loader(
    dataset,
    batch_size: int,
    shuffle: bool = True,
    workers: int | None = None,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    distributed: bool | None = None,
    drop_last: bool = False,
    *,
    seed: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    normalize: bool = False,
    prefetch_thread: bool | None = None,
    pad: bool = False,
    augment: list | Callable[[int], list | None] | None = None,
    augment_on: str = "auto",
    min_visibility: float = DEFAULT_MIN_VISIBILITY,
    collate: str = "auto",
    threads: int | None = None,
    channels_last: bool = False,
    window: int | None = None,
    partitions: int | None = None,
    multiprocessing_context=None,
    storage_options: dict | None = None,
    split: str | None = None,
    timeout: float | None = None,
) -> CacheLoader:
    """A DataLoader for ``dataset`` (a CachedDataset, or a cache's path or URL, opened with
    ``storage_options``; ``split``: one split's cache of a folder of split caches) with sampler,
    reading mode and pinning chosen.

    - Shuffling: ``ShardAwareDistributedSampler`` (class-mixed, a new order every pass; ``window``
      samples shuffled together, default per the cache; ``partitions``: fixed shard sets per
      node, default one per node for caches on object storage), over this rank's share when
      ``distributed`` (default: a process group is initialised).
    - ``augment``: ``cachekit.transforms`` run per batch, each sample's draws from (``seed``, epoch,
      index); on the GPU when ``device`` is CUDA (``augment_on="auto"``), else by ``threads``
      threads (default: this rank's share of the CPUs) in this process. Boxes and masks move with
      the pixels; a box keeping less than ``min_visibility`` of its area is dropped. A function
      ``augment(epoch) -> list`` gives each epoch its own list; ``loader.set_augment([...])``
      changes it from the next epoch on (both kept by ``state_dict`` for an exact resume).
    - ``seed`` (default: from ``torch.initial_seed()``, so ``torch.manual_seed`` sets it; the same on
      every rank, broadcast from rank 0): the shuffle's and the augmentation's.
    - Targets: the class (``labels [B]``) for classification caches; for caches with fields a list
      of per-sample dicts when a field varies in size (boxes), else a dict of stacked tensors
      (masks); ``collate="yolo"``: Ultralytics' ``[M, 6]`` rows (image, class, cx, cy, w, h).
    - ``workers`` (default 0: in-process reads with a prefetch thread; ``suggest_num_workers`` for
      per-sample ``transform=`` functions and codecs that decode serially). Worker processes hand
      batches over through /dev/shm: when it is too small for them (a container's 64 MB), chosen
      workers give way to in-process reads with a warning, and asked-for ones are refused in one
      line (``ShmTooSmall``) naming ``--shm-size`` / ``--ipc=host``.
    - ``pin_memory`` (default: CUDA is available and batches go to it).
    - ``device``: batches are moved there (side stream on CUDA); ``dtype`` (a float type) scales
      uint8 to [0, 1] there, ``normalize`` applies the cache's mean/std in fp32 (default dtype
      float32), ``channels_last`` sets that memory format (crops, resizes and flips on the CPU
      threads write it as they read: fastest from a ``--store pixels-hwc`` cache).
    - ``pad``: variable-sized samples zero-padded to the batch's largest, as ``(images, labels,
      sizes)``; an ``augment`` ending in a fixed size needs no padding.
    - Worker processes start as torch's DataLoader starts them on Linux, by fork (no main guard
      needed; ``multiprocessing_context`` to choose), and end with this process however it ends;
      one that dies is named within a second or so (``WorkerExited``). ``timeout`` (default
      ``READ_TIMEOUT_SECONDS``, 600): the longest a pass waits for one batch, worker processes'
      handover included, then ``ReadTimeout`` (stuck workers are killed; the next pass starts anew).
    """
    check_counts(
        batch_size=batch_size, prefetch_factor=prefetch_factor, seed=seed, workers=workers, threads=threads
    )
    timeout = READ_TIMEOUT_SECONDS if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds (a read never waits for ever), got {timeout!r}")
    dataset = open_dataset(dataset, storage_options, split)
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    device = check_device(device)
    choose_augment_on(augment_on, device, None)  # a bad augment_on fails whatever the plan
    per_sample = any(
        getattr(dataset, a, None) is not None for a in ("transform", "target_transform", "transforms")
    )
    readable = hasattr(dataset, "read_request")  # a CachedDataset: batches are read as requests

    def on_device_for(plan) -> bool:
        return choose_augment_on(augment_on, device, plan)

    sent = {"workers": 0}  # known once the first plan has sized them

    def check(plan) -> None:
        if sent["workers"] > 0:  # a later plan (set_augment, a schedule) goes to the same workers
            check_plan_pickles(plan, sent["context"])
        check_augment_plan(
            dataset, batch_size, plan, pad=pad, per_sample=per_sample, on_device=on_device_for(plan)
        )
        if plan is not None and plan.mix is not None:  # CutMix on boxes, MixUp on masks alone: one line
            plan.mix.check_cache(getattr(dataset, "fields", {}), len(getattr(dataset, "classes", None) or ()))
        if plan is not None and plan.needs_boxes:  # an IoU crop: here, not at the first batch (in a worker)
            boxes_field(dataset)

    if not readable and augment is not None:
        raise TypeError("augment needs a cachekit CachedDataset")
    schedule = AugmentSchedule(augment, min_visibility=min_visibility, check=check) if readable else None
    plan = schedule.upcoming(0) if schedule is not None else None  # the first epoch's: sizes workers
    collate_fn = Collate(pad=pad, targets=collate, fields=getattr(dataset, "fields", None))
    if collate == "yolo":
        check_yolo_collate(getattr(dataset, "fields", {}))
    seed_chosen = seed is None
    seed = resolve_seed(seed, distributed)
    on_device = on_device_for(plan)
    codec = getattr(getattr(dataset, "manifest", None), "format_options", {}).get("compression", "none")
    asked = workers is not None
    if workers is None:
        workers = suggest_num_workers(batch_size) if per_sample or codec in _SERIAL_CODECS else 0
    workers = fit_workers(workers, asked, batch_bytes(dataset, batch_size, plan), prefetch_factor)
    sent["workers"] = workers
    if workers > 0:  # fork on Linux, as torch's DataLoader (the user's context as given)
        check_not_rerun()
        sent["context"] = worker_context(multiprocessing_context)
        check_plan_pickles(plan, sent["context"])
    if threads is None:
        threads = 1 if workers > 0 else suggest_threads()
    if prefetch_thread is None:
        prefetch_thread = workers == 0
    if pin_memory is None:
        pin_memory = torch.cuda.is_available() and (device is None or device.type == "cuda")
    processes = local_world_size() * max(1, workers)  # reading processes on this node
    if window is None and callable(getattr(dataset, "block_shards", None)):  # blocks the node cache holds
        nodes = partitions if partitions is not None else node_partitions(dataset, world, local_world_size())
        window = _window_that_fits(dataset, default_window(dataset, len(dataset), processes, nodes), batch_size,
                                   processes, world, nodes)  # fmt: skip
    sampler = ShardAwareDistributedSampler(
        dataset,
        num_replicas=world,
        rank=rank,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last and distributed,
        window=window,
        partitions=partitions,
        group_spread=batch_size,  # an input's augmented variants never share a batch
    )
    sampler.seed_chosen = seed_chosen
    if hasattr(dataset, "check_batch_shards"):  # a cache on object storage: its node cache must hold
        dataset.check_batch_shards(
            batch_size,
            sampler.window,
            processes,
            world=world,
            partitions=sampler.partitions,
        )
    mean = std = None
    if normalize:
        mean, std = getattr(dataset, "normalization", None) or (dataset.manifest.mean, dataset.manifest.std)
    stage = DeviceStage(device, dtype=dtype, mean=mean, std=std, channels_last=channels_last)
    if workers > 0:
        mode = f"{workers} worker processes"
    else:
        mode = "in-process batched reads" + (" + prefetch thread" if prefetch_thread else "")
        if threads > 1:
            mode += f", {threads} threads over each batch"
    if schedule is not None and schedule.scheduled:
        mode += "; augment a function of the epoch"
    if plan is not None:
        mode += f"; augment on {device}" if on_device else "; augment on CPU threads"
    requests = None
    if readable:
        requests = {
            "seed": seed,
            "plan": plan,
            "threads": threads,
            "on_device": on_device,
            "on_device_for": on_device_for,
            "channels_last": channels_last,
            "timeout": timeout,
        }
    extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor} if workers > 0 else {}
    if workers > 0:  # waits bounded by timeout= in the loader's own iterator (workers.WorkerBatches)
        extra["multiprocessing_context"] = sent["context"]
        extra["worker_init_fn"] = worker_init(sent["context"])
    loader = CacheLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        drop_last=drop_last,
        prefetch_thread=prefetch_factor if (prefetch_thread and workers == 0) else 0,
        stage=stage,
        requests=requests,
        mode=mode,
        pad=pad,
        schedule=schedule,
        read_timeout=timeout,
        **extra,
    )
    if len(loader) == 0:
        raise ValueError(
            f"rank {rank} of {world} would get no batches ({len(sampler)} of {len(dataset)} samples, "
            f"batch_size {batch_size}, drop_last={drop_last}): every rank would skip the epoch; use a "
            "smaller batch_size or drop_last=False"
        )
    log.info(
        "make_loader: %s, batch %d, pin_memory=%s, %s",
        mode,
        batch_size,
        pin_memory,
        f"distributed over {world} ranks" if distributed else "one process",
    )
    return loader
