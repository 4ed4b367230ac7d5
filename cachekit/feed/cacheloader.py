"""``CacheLoader``: a DataLoader that reads a cache's batches as requests of the current epoch, reads
ahead in a thread, and finishes batches on a device; it keeps the epoch's augmentation and resume point.

``make_loader`` (``feed.loader``) chooses its options; this module only runs them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from ..errors import UsageError
from .assemble import BatchRequest
from .devicestage import DeviceStage
from .prefetch import Prefetcher
from .sampler import ShardAwareDistributedSampler
from .schedule import AugmentSchedule
from .stages import StageLog
from .timeouts import READ_TIMEOUT_SECONDS, ReadTimeout
from .workers import WorkerBatches, WorkerExited

__all__ = ["CacheLoader"]


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
        stage_log: StageLog | None = None,
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
        #: ``len()`` counts the whole epoch's batches, also while a resumed epoch has fewer left: what
        #: a loop that adds the batches it ran before the resume expects (Lightning's). False: the
        #: batches the next pass will give.
        self.whole_epoch_len = False
        #: Where the loader's processes time their stages (``make_loader(profile=True)``), else None.
        self.stage_log = stage_log

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

    def __len__(self) -> int:
        """Batches of the next pass (a resumed epoch's left), or of a whole epoch (``whole_epoch_len``)."""
        sampler = self.sampler
        if not (self.whole_epoch_len and isinstance(sampler, ShardAwareDistributedSampler) and self.batch_size):
            return super().__len__()
        share = sampler.num_samples  # this rank's share of a whole epoch
        return share // self.batch_size if self.drop_last else -(-share // self.batch_size)

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        return WorkerBatches(self)

    def stage_events(self) -> list[dict]:
        """The stages its processes and threads ran since the last call, as Chrome trace events on the
        wall clock (``feed.stages``; ``cachekit.add_stages`` lays them over a torch.profiler trace).
        Refused in one line unless the loader was made with ``profile=True``."""
        if self.stage_log is None:
            raise UsageError("this loader's stages are not timed: make it with make_loader(..., profile=True)")
        return self.stage_log.events()

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
