"""``make_loader``: a real DataLoader over a cache, in the fastest mode for that cache.

For a pixel cache a batch read is one memory copy per shard, and worker processes cost more than
they save (every batch is copied into shared memory and out again). So a pixel cache is read in
this process, with a background thread fetching the next batch while the step runs; worker
processes are used where reading costs CPU (encoded stores, per-sample transforms).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from ..cpus import available_cpus
from .dataset import collate_batch, pad_collate
from .sampler import ShardAwareDistributedSampler

__all__ = ["CacheLoader", "make_loader", "suggest_num_workers"]

log = logging.getLogger("cachekit")


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def suggest_num_workers(
    batch_size: int, max_workers: int | None = None, world_size: int | None = None
) -> int:
    """``min(cpus // world_size, batch_size if batch_size > 1 else 0, max_workers)`` for decode-heavy loading.

    ``cpus`` is what this process may really use (affinity, capped by the cgroup CPU quota);
    ``world_size`` defaults to the initialised process group's, so ranks on one node share the CPUs.
    """
    world = _world_size() if world_size is None else world_size
    candidates = [available_cpus() // max(world, 1), batch_size if batch_size > 1 else 0]
    if max_workers is not None:
        candidates.append(max_workers)
    return max(0, min(candidates))


_LIVE_PREFETCHERS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _stop_prefetchers() -> None:
    """Let prefetch threads finish their current read before the interpreter goes away.

    A daemon thread still inside torch's C++ code when Python finalises aborts the process
    ("terminate called without an active exception"), so each is stopped and joined first.
    """
    for prefetcher in list(_LIVE_PREFETCHERS):
        prefetcher.stop(timeout=30)


class _Prefetcher:
    """Runs an iterator in a daemon thread, ``depth`` items ahead; errors are re-raised in the caller."""

    _END = object()

    def __init__(self, it: Iterator, depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(it,), daemon=True, name="cachekit-prefetch")
        _LIVE_PREFETCHERS.add(self)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, it: Iterator) -> None:
        try:
            for item in it:
                if not self._put((True, item)):
                    return
        except BaseException as exc:  # handed to the consumer
            self._put((False, exc))
            return
        self._put((True, self._END))

    def __iter__(self) -> Iterator:
        try:
            while True:
                ok, item = self._queue.get()
                if not ok:
                    raise item
                if item is self._END:
                    return
                yield item
        finally:
            self._stop.set()


class CacheLoader(DataLoader):
    """A DataLoader that can prefetch in a thread and hand batches over on a device, normalised.

    ``mode`` says how it reads ("in-process + prefetch thread", "N worker processes", ...).
    ``state_dict()`` records how far the current epoch got, from batches actually delivered.
    """

    def __init__(
        self,
        *args: Any,
        prefetch_thread: int = 0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        mean: Any = None,
        std: Any = None,
        mode: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.prefetch_thread = prefetch_thread
        self.device = torch.device(device) if device is not None else None
        self.out_dtype = dtype
        self._mean = None if mean is None else torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self._std = None if std is None else torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.mode = mode
        self._delivered = 0
        self._epoch_start = 0

    def _finish(self, batch):
        images, labels, *rest = batch
        if self.device is not None:
            images = images.to(self.device, non_blocking=True)
            labels = labels.to(self.device, non_blocking=True)
        if self.out_dtype is not None or self._mean is not None:
            images = images.to(self.out_dtype or torch.float32).div_(255.0)
            if self._mean is not None:
                mean = self._mean.to(images.device, images.dtype)
                std = self._std.to(images.device, images.dtype)
                images = images.sub_(mean).div_(std)
        return (images, labels, *rest)

    def __iter__(self) -> Iterator:
        sampler = self.sampler if isinstance(self.sampler, ShardAwareDistributedSampler) else None
        self._epoch_start = sampler._start if sampler is not None else 0
        self._delivered = 0
        it = super().__iter__()
        if self.prefetch_thread:
            it = iter(_Prefetcher(it, self.prefetch_thread))
        for batch in it:
            self._delivered += 1
            yield self._finish(batch)

    def state_dict(self) -> dict:
        """Resume point of the current epoch (for the shard-aware sampler)."""
        if not isinstance(self.sampler, ShardAwareDistributedSampler):
            raise TypeError("state_dict needs the loader's sampler to be a ShardAwareDistributedSampler")
        consumed = min(self._epoch_start + self._delivered * (self.batch_size or 1), self.sampler.num_samples)
        return self.sampler.state_dict(consumed=consumed)

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state)


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
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    normalize: bool = False,
    prefetch_thread: bool | None = None,
    pad: bool = False,
) -> CacheLoader:
    """A DataLoader for ``dataset`` (a CachedDataset) with the sampler, workers and pinning chosen.

    - ``distributed`` (default: a process group is initialised): a ShardAwareDistributedSampler
      over this rank's share; otherwise the same sampler for one replica (shard-local shuffling).
    - ``workers`` (default: 0 with a prefetch thread for pixel caches; ``suggest_num_workers``
      when samples need decoding or a transform).
    - ``pin_memory`` (default: CUDA is available).
    - ``device``: batches are moved there with ``non_blocking=True``; ``dtype`` converts uint8 to a
      float type in [0, 1] there, and ``normalize`` also applies the cache's mean/std.
    - ``pad``: for caches of variable-sized samples, batches are zero-padded to their largest
      image and come as ``(images, labels, sizes)``; without it such a batch is an error.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if distributed is None:
        distributed = dist.is_available() and dist.is_initialized()
    world = _world_size() if distributed else 1
    decode_heavy = (
        bool(getattr(dataset, "decode_heavy", False)) or getattr(dataset, "transform", None) is not None
    )
    if workers is None:
        workers = suggest_num_workers(batch_size, world_size=world) if decode_heavy else 0
    if prefetch_thread is None:
        prefetch_thread = workers == 0
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    sampler = ShardAwareDistributedSampler(
        dataset,
        num_replicas=world if distributed else 1,
        rank=(dist.get_rank() if distributed else 0),
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last and distributed,
    )
    mean = std = None
    if normalize:
        manifest = dataset.manifest
        mean, std = manifest.mean, manifest.std
        dtype = dtype or torch.float32
    if workers > 0:
        mode = f"{workers} worker processes"
    else:
        mode = "in-process batched reads" + (" + prefetch thread" if prefetch_thread else "")
    log.info(
        "make_loader: %s, batch %d, pin_memory=%s, %s",
        mode,
        batch_size,
        pin_memory,
        f"distributed over {world} ranks" if distributed else "one process",
    )
    extra = {"persistent_workers": True, "prefetch_factor": prefetch_factor} if workers > 0 else {}
    return CacheLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=pad_collate if pad else collate_batch,
        pin_memory=pin_memory,
        drop_last=drop_last,
        prefetch_thread=prefetch_factor if (prefetch_thread and workers == 0) else 0,
        device=device,
        dtype=dtype,
        mean=mean,
        std=std,
        mode=mode,
        **extra,
    )
