"""``mix``: several caches read as one dataset, each drawn in proportion to its weight.

``mix([CachedDataset(a), CachedDataset(b)], weights=[0.7, 0.3])`` is a map-style dataset that
``make_loader`` takes like a single cache: its index space is the sources' indices end to end (source
``i``'s sample ``k`` is index ``starts[i] + k``), and it brings its own epoch order
(``mixorder.mixed_order``) that ``ShardAwareDistributedSampler`` deals out, resumes (at a global
position, on any world size) and partitions per node. A batch is read in one go: the rows of every
source are borrowed from that source's reader pool and assembled (and augmented) together.
Each source's labels are shifted by its ``class_offsets`` entry, so classes of different caches
never share an index; ``classes`` lists them all, in that order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..cpus import local_world_size
from ..errors import UsageError
from .assemble import BatchRead, BatchRequest, assemble
from .batch import SampleBatch
from .buffers import BufferPool
from .mixorder import MixedOrder, Source, shares
from .order import default_window
from .rows import mosaic_extras, read_rows
from .stages import clock, timed

__all__ = ["MAX_SAMPLES_PER_EPOCH", "MixedDataset", "mix"]

#: The most samples one epoch of a mix may have. Its order is evaluated in each rank's share a page
#: at a time (a few MB whatever the epoch's length); a mix with a source on object storage plans its
#: downloads with the rank's whole share (8 bytes a sample, 2 GiB at the limit on one rank), as a
#: single cache does. Longer runs are more epochs.
MAX_SAMPLES_PER_EPOCH = 2**28


def _epoch_samples(samples_per_epoch, default: int) -> int:
    """``samples_per_epoch`` checked: a whole number from 1 to ``MAX_SAMPLES_PER_EPOCH`` (None: ``default``)."""
    if samples_per_epoch is None:
        samples_per_epoch = default
    ok = isinstance(samples_per_epoch, numbers.Integral) and not isinstance(samples_per_epoch, bool)
    if not ok or not 1 <= int(samples_per_epoch) <= MAX_SAMPLES_PER_EPOCH:
        shown = repr(samples_per_epoch)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise UsageError(
            f"samples_per_epoch must be a whole number from 1 to {MAX_SAMPLES_PER_EPOCH} (train more "
            f"epochs instead), got {shown}"
        )
    return int(samples_per_epoch)


def _normalized(weights, n: int) -> list[float]:
    """The weights as shares summing to 1: ``n`` finite non-negative numbers, not all 0, whose sum is finite."""
    try:
        w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        w = np.full(0, np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        total = w.sum() if w.shape == (n,) else np.nan
    if w.shape != (n,) or not np.all(np.isfinite(w)) or (w < 0).any() or not 0 < total < np.inf:
        raise UsageError(
            f"weights must be {n} non-negative numbers, not all 0, whose sum is a finite number: {weights!r}"
        )
    return (w / total).tolist()


def _layout(ds) -> dict[str, str]:
    """What a batch needs the sources to share, in words."""
    shape = "x".join(str(s) for s in ds.sample_shape if s is not None)
    size = f"variable-size ({ds.sample_shape[0]} channels)" if ds.ragged else f"fixed-size {shape}"
    return {"samples": size, "store": str(ds.store)}


def _check_one_layout(sources: list) -> None:
    """Refuse sources a batch cannot hold together, naming what differs and in which source."""
    layouts = [_layout(ds) for ds in sources]
    for what in layouts[0]:
        values = [lay[what] for lay in layouts]
        if len(set(values)) > 1:
            each = "; ".join(f"{ds!r}: {v}" for ds, v in zip(sources, values))
            raise UsageError(
                f"mix needs caches of one sample layout, and their {what} differ ({each}): build them "
                "with the same recipe"
            )


class MixedDataset(Dataset):
    """Caches mixed by weight (see ``mix``); ``epoch_len`` samples an epoch."""

    def __init__(
        self, sources: Sequence, weights: Sequence[float], samples_per_epoch: int | None = None
    ) -> None:
        self.sources = list(sources)
        if len(self.sources) < 1:
            raise UsageError("mix needs at least one dataset")
        for ds in self.sources:
            if not hasattr(ds, "borrowed_rows"):
                raise UsageError(f"mix takes cachekit CachedDatasets, got {type(ds).__name__}")
            if ds.transform is not None or ds.target_transform is not None:
                raise UsageError("mix reads whole batches: give augment= to make_loader, not transform=")
            if ds.group_size != 1:
                raise UsageError(f"{ds!r} holds augmented variants; mix takes caches of one sample an input")
            if ds.fields:
                raise UsageError(
                    f"{ds!r} has fields besides the class ({', '.join(ds.fields)}); mix reads classification "
                    "caches (targets of several kinds would need one class numbering across the sources)"
                )
        first = self.sources[0]
        _check_one_layout(self.sources)
        self.weights = _normalized(weights, len(self.sources))
        lengths = [len(ds) for ds in self.sources]
        if min(lengths) < 1:
            raise UsageError("mix: a source has no samples")
        #: Samples of one epoch (default: all the sources' samples, however they are weighted).
        self.epoch_len = _epoch_samples(samples_per_epoch, sum(lengths))
        #: Index of each source's first sample in the mixed index space.
        self.starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.shard_offsets = np.concatenate(
            [[0], *[ds.shard_offsets[1:] + start for ds, start in zip(self.sources, self.starts[:-1])]]
        ).astype(np.int64)
        counts = [len(ds.classes) for ds in self.sources]
        #: Added to each source's labels: classes of different caches never share an index.
        self.class_offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64).tolist()
        #: Each source's default window (samples shuffled together), as it would be read alone.
        self.windows = [default_window(ds, len(ds), local_world_size()) for ds in self.sources]
        self.sample_shape, self.store, self.ragged = first.sample_shape, first.store, first.ragged
        self.transform = self.target_transform = None
        self.group_size = 1
        self._buffers = BufferPool()
        self._pid = os.getpid()
        #: Each stream's last group of passes, kept between epochs (``mixorder._stream``).
        self._passes: dict = {}

    # -- what the sampler and make_loader read --------------------------------------------------

    def __len__(self) -> int:
        """The size of the index space (every source's samples); an epoch is ``epoch_len``."""
        return int(self.starts[-1])

    def __repr__(self) -> str:
        parts = ", ".join(f"{ds!r}: {w:.3g}" for ds, w in zip(self.sources, self.weights))
        return f"MixedDataset({parts}; {self.epoch_len} samples an epoch)"

    @property
    def url(self) -> str | None:
        """A source's URL when one is on object storage (the sampler then partitions per node)."""
        return next((ds.url for ds in self.sources if ds.url), None)

    @property
    def shards_mixed(self) -> bool:
        return all(ds.shards_mixed for ds in self.sources)

    @property
    def decode_heavy(self) -> bool:
        return any(ds.decode_heavy for ds in self.sources)

    @property
    def classes(self) -> list[str]:
        return [name for ds in self.sources for name in ds.classes]

    @property
    def max_partitions(self) -> int:
        return min(len(ds) for ds in self.sources)

    @property
    def fingerprint(self) -> str:
        """What the order depends on: the sources' fingerprints, the weights and the epoch length."""
        spec = [[ds.manifest.fingerprint for ds in self.sources], self.weights, self.epoch_len]
        return hashlib.sha256(json.dumps(spec).encode()).hexdigest()

    @property
    def normalization(self) -> tuple[list[float], list[float]]:
        """Mean and std per channel of the mix (each source's, weighted): ``make_loader(normalize=True)``."""
        means = np.array([ds.manifest.mean for ds in self.sources], dtype=np.float64)
        stds = np.array([ds.manifest.std for ds in self.sources], dtype=np.float64)
        w = np.asarray(self.weights)[:, None]
        mean = (w * means).sum(0)
        var = (w * (stds**2 + (means - mean) ** 2)).sum(0)
        return mean.tolist(), np.sqrt(var).tolist()

    def epoch_order(self, seed: int, epoch: int, shuffle: bool, window, partitions: int) -> MixedOrder:
        """Epoch ``epoch``'s ``epoch_len`` indices (``window``: samples shuffled together in every
        source, or a list of one per source; None: ``windows``), evaluated at the positions asked
        for (``order[positions]``), never built whole: ``mixorder.mixed_order``'s, position by position."""
        windows = self.windows if window is None else window
        if not isinstance(windows, (list, tuple)):
            windows = [int(windows)] * len(self.sources)
        sources = [
            Source(start, ds.shard_offsets, w, ds.shards_mixed or w < len(ds))
            for ds, start, w in zip(self.sources, self.starts[:-1].tolist(), windows)
        ]
        # the key is what the passes depend on beyond (seed, source, partition): windows, partitions
        kept = self._passes.setdefault((tuple(windows), int(partitions), bool(shuffle)), {})
        if len(self._passes) > 4:  # other settings asked for: keep only the current ones
            self._passes = {k: v for k, v in self._passes.items() if v is kept}
        return MixedOrder(sources, self.weights, self.epoch_len, seed, epoch, shuffle, partitions, kept)

    def draws_per_epoch(self) -> list[int]:
        """Samples each source gives an epoch (without node partitions)."""
        return shares(self.epoch_len, self.weights).tolist()

    # -- reading -------------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffers"] = None
        state["_passes"] = {}  # drawn again where needed: never shipped to workers
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._buffers = BufferPool()

    def _split(self, indices) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"index out of range for a mix of {len(self)} samples")
        return idx, np.searchsorted(self.starts, idx, side="right") - 1

    def read_request(self, request: BatchRequest) -> SampleBatch:
        """One batch over every source: each source's rows borrowed from its reader pool, then
        read (and augmented, each sample's draws from its mixed index) together."""
        if self._pid != os.getpid():
            self._buffers, self._pid = BufferPool(), os.getpid()
        extra = mosaic_extras(request, self)
        indices = read_rows(request, extra)
        idx, which = self._split(indices)  # a mosaic's extra samples too
        readers: list = [None] * len(idx)
        local = np.empty(len(idx), dtype=np.int64)
        labels = np.empty(len(idx), dtype=np.int64)
        with contextlib.ExitStack() as stack:
            with timed(clock(request.stages), "fetch"):
                for i in np.unique(which).tolist():
                    pos = np.flatnonzero(which == i)
                    rows = idx[pos] - self.starts[i]
                    got, got_local, got_labels = stack.enter_context(self.sources[i].borrowed_rows(rows))
                    for j, reader in zip(pos.tolist(), got):
                        readers[j] = reader
                    local[pos] = got_local
                    labels[pos] = np.where(got_labels >= 0, got_labels + self.class_offsets[i], got_labels)
            read = BatchRead(indices, readers, local, labels, list, self._buffers, extra, lambda: self.normalization)
            return assemble(self, request, read)

    def __getitems__(self, indices: Sequence[int]) -> SampleBatch:
        return self.read_request(indices if isinstance(indices, BatchRequest) else BatchRequest(indices))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        batch = self.read_request(BatchRequest([int(index)]))
        return batch.images[0], int(batch.labels[0])

    def read_batch(self, indices, *, threads: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Images and labels of mixed ``indices``, in that order."""
        batch = self.read_request(BatchRequest(indices, threads=threads))
        return batch.images, batch.labels

    # -- caches on object storage ----------------------------------------------------------------

    def _per_source(self, indices) -> dict[int, np.ndarray]:
        idx, which = self._split(indices)
        return {i: idx[which == i] - self.starts[i] for i in np.unique(which).tolist()}

    def plan_reads(self, indices, following: Callable[[], np.ndarray] | None = None) -> None:
        if not any(getattr(ds, "remote", False) for ds in self.sources):
            return  # nothing to fetch ahead: a pass's indices are never made whole for it
        for i, rows in self._per_source(indices).items():
            later = None if following is None else (lambda i=i: self._per_source(following()).get(i, []))
            self.sources[i].plan_reads(rows, later)

    def reading(self, indices) -> None:
        for i, rows in self._per_source(indices).items():
            self.sources[i].reading(rows)

    def mosaic_pool(self, indices) -> np.ndarray | None:
        """Where a mosaic's extra samples come from (``CachedDataset.mosaic_pool``): when any source
        is on object storage, the samples of the shards the batch reads, in every source it reads."""
        if not any(getattr(ds, "remote", False) for ds in self.sources):
            return None
        idx, which = self._split(indices)
        pools = [self.sources[i].shard_pool(idx[which == i] - self.starts[i]) + self.starts[i]
                 for i in np.unique(which).tolist()]  # fmt: skip
        return np.concatenate(pools) if pools else np.zeros(0, np.int64)

    def check_batch_shards(
        self, batch_size: int, window, processes: int, *, world: int = 1, partitions: int = 1
    ):
        windows = self.windows if window is None else window
        if not isinstance(windows, (list, tuple)):
            windows = [int(windows)] * len(self.sources)
        for ds, w, share in zip(self.sources, windows, self.weights):
            if share > 0:
                ds.check_batch_shards(batch_size, w, processes, world=world, partitions=partitions)

    def close(self) -> None:
        for ds in self.sources:
            ds.close()


def mix(datasets: Sequence, weights: Sequence[float] | None = None, *, samples_per_epoch: int | None = None):
    """Several caches (``CachedDataset``\\ s, local or on object storage) as one dataset for
    ``make_loader``, each drawn in proportion to its weight (default: equal).

    - An epoch is ``samples_per_epoch`` samples (default: the sources' samples together); source
      ``i`` gives ``weights[i]`` of them (to the sample), spread evenly over the epoch.
    - Each source is read pass after pass, each pass a new shuffle of all its samples (without
      replacement within a pass); a pass may span epochs, or an epoch several passes.
    - Deterministic from ``make_loader``'s seed; the loader's ``state_dict`` resumes it mid-epoch,
      on another world size too; with several nodes each reads fixed parts of every source.
    - Labels: source ``i``'s classes become ``class_offsets[i] + label``; ``classes`` lists them all.
    """
    datasets = list(datasets)
    return MixedDataset(
        datasets, weights if weights is not None else [1.0] * len(datasets), samples_per_epoch
    )
