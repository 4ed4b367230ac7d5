"""``CachedDataset``: a map-style torch Dataset over a cache, with batched reads.

The dataset holds only the manifest, whose shards (format 5) are a memory-mapped index shared by
the node's processes and pickled by path; shard readers are opened lazily in whichever process
reads (each DataLoader worker opens its own), and a shard is checked when first opened, not all at
start-up, so the object pickles small and opening costs the same at any number of shards.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import CacheError
from ..store.encoding import RAW_STORES, STORES
from ..store.formats import ShardReader, get_format
from ..store.sourcecol import source_at, source_prefix
from .assemble import BatchRead, BatchRequest, assemble
from .batch import SampleBatch, stack_images
from .buffers import BufferPool
from .cacheopen import checked_shard_path, open_cache
from .readers import ReaderPool, default_max_open
from .rows import mosaic_extras, read_rows
from .samplereads import memo_of, read_each, tensors
from .stages import clock, timed
from .storagereads import ShardStorage
from .targets import check_labels

__all__ = ["CachedDataset"]


class CachedDataset(ShardStorage, Dataset):
    """Samples of a cache as ``(uint8 tensor [C, H, W], target)``: the target is the int class of a
    classification cache, and a dict of the sample's fields otherwise (``boxes`` float32 ``[N, 4]``
    xyxy with ``classes`` and ``iscrowd``; ``mask`` uint8 ``[H, W]``; ``labels``; ``text``; ...).

    ``transform`` is applied to each image tensor and ``target_transform`` to each target, or
    ``transforms`` to both at once (``transforms(image, target) -> (image, target)``, as
    torchvision's datasets take it: what moves boxes and masks with a crop it makes); without
    them, ``__getitems__`` reads a whole batch with one gather per shard.

    ``path`` may be an fsspec URL (``s3://bucket/cache``; ``storage_options`` such as
    ``{"endpoint_url": ...}`` go to fsspec and nowhere else): each shard is fetched whole, once per
    node, into ``local_cache`` (default: ``CACHEKIT_LOCAL_CACHE``, else the user's private
    ``~/.cache/cachekit/shards``; a folder others may write in is refused), checked against the
    manifest (and again before each reuse), shared by every rank and worker of the node and kept within
    ``local_cache_bytes`` (default 20 GB), least recently used first out; ``make_loader`` fetches
    upcoming shards ahead of need.

    At most ``max_open_shards`` shard readers stay open per process (default: from the open-file
    limit, see ``cachekit.feed.readers``, and for remote caches what the byte limit allows); the
    least recently used is closed to open another.

    ``split``: the cache of one split in a folder of split caches (``CachedDataset("cache",
    split="train")`` opens ``cache/train``, as ``cachekit build`` writes a RAW that names splits).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        transform: Callable | None = None,
        *,
        target_transform: Callable | None = None,
        transforms: Callable | None = None,
        local_cache: str | os.PathLike | None = None,
        local_cache_bytes: int | None = None,
        max_open_shards: int | None = None,
        storage_options: dict | None = None,
        split: str | None = None,
    ) -> None:
        opened = open_cache(path, split=split, storage_options=storage_options, local_cache=local_cache,
                            local_cache_bytes=local_cache_bytes)  # fmt: skip
        self.url, self.root, self.manifest, self._remote = opened.url, opened.root, opened.manifest, opened.remote
        self._format = get_format(self.manifest.format, reading=True)
        self.store = self.manifest.format_options.get("store", "pixels")
        self.ragged = self.manifest.sample.ragged
        if self.store not in STORES:
            raise CacheError(
                f"manifest.format_options.store: unknown store {self.store!r} (known: {', '.join(STORES)})"
            )
        #: ``shard_offsets[k]`` is the global index of shard k's first sample; the last entry is len
        #: (format 5: a view of the mapped index, shared by the node's processes, never pickled).
        self._offsets = None if self.manifest.index else self.manifest.shard_offsets
        if transforms is not None and (transform is not None or target_transform is not None):
            raise ValueError("give transforms=(image, target) or transform= and target_transform=, not both")
        self.transform = transform
        self.target_transform = target_transform
        self.transforms = transforms
        geometric = [n for n, f in self.manifest.sample.fields.items() if f.kind in ("boxes", "mask")]
        if transform is not None and geometric:
            warnings.warn(
                f"transform= sees only the image, and this cache's {', '.join(geometric)} would not follow "
                "a crop, flip or resize it makes: use transforms=lambda image, target: ... (both at once), "
                "or make_loader(augment=[...]), which moves them",
                stacklevel=2,
            )
        default = default_max_open(self._format.files_per_reader)
        if self._remote is not None:  # every open reader pins its shard on the node
            default = min(default, self._remote.readers_that_fit())
        self.max_open_shards = max_open_shards or default
        self._readers = self._reader_pool()
        self._buffers = BufferPool()
        self._pid = os.getpid()
        if self._remote is not None and not self.manifest.index:
            self._remote.check_files()  # formats 3 and 4 on object storage: one listing, as before

    @property
    def shard_offsets(self) -> np.ndarray:
        return self._offsets if self._offsets is not None else self.manifest.shard_offsets

    # -- metadata -----------------------------------------------------------------------------

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    @property
    def fields(self) -> dict:
        """The sample's fields besides the image (``FieldSpec`` by name); empty for classification."""
        return self.manifest.sample.fields

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.manifest.sample.shape

    @property
    def num_shards(self) -> int:
        return len(self.manifest.shards)

    @property
    def shards_mixed(self) -> bool:
        """True when the build spread inputs over the shards in a seeded random order (``--order
        shuffled``): every shard holds a sample of every class, so a shuffle may stay shard-local."""
        return self.manifest.shards_mixed

    @property
    def group_size(self) -> int:
        """Samples stored per input: the augmented variants of one image sit side by side."""
        augment = self.manifest.pipeline.get("augment")
        return int(augment["variants"]) if isinstance(augment, dict) else 1

    @property
    def decode_heavy(self) -> bool:
        """True when reading a sample costs real CPU, so worker processes pay off.

        Encoded stores (JPEG/PNG) and slow codecs (gzip, zstd, lzf: ~0.5-1 ms a sample) are;
        pixels, raw or lz4-compressed (~20 us), are not: workers would only add copies.
        """
        codec = self.manifest.format_options.get("compression", "none")
        return self.store not in RAW_STORES or codec in ("gzip", "zstd", "lzf")

    def __len__(self) -> int:
        return int(self.shard_offsets[-1])

    def __repr__(self) -> str:
        return f"CachedDataset({self.url or str(self.root)!r}, samples={len(self)}, shape={list(self.sample_shape)})"

    # -- reading ------------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_readers"] = state["_buffers"] = None  # open readers never travel to another process
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._readers = self._reader_pool()
        self._buffers = BufferPool()

    def _reader_pool(self) -> ReaderPool:
        """An empty pool; closing a reader of a remote cache unpins its shard's local copy.

        The hook holds the remote cache, not the dataset: a dataset that holds a pool that holds
        the dataset would be a cycle, freed (its shards unmapped) only when the cyclic collector ran.
        """
        remote, shards = self._remote, self.manifest.shards
        on_close = None if remote is None else (lambda shard: remote.unpin(shards[shard]))
        return ReaderPool(self.max_open_shards, on_close=on_close)

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked into a worker: never use the parent's handles
            self._readers.forget()  # the parent's readers: dropped, the parent goes on using them
            self._buffers = BufferPool()
            self._pid = os.getpid()

    def _reader(self, shard: int):
        """``with self._reader(k) as reader``: shard ``k``'s reader, borrowed from the pool."""
        self._check_process()
        return self._readers.using(shard, lambda: self._open_reader(shard))

    def _open_reader(self, shard: int) -> ShardReader:
        info = self.manifest.shards[shard]
        if self._remote is None:
            return self._format.open(checked_shard_path(self.root, info), self.manifest.sample, info.samples, self.store)
        path = self._remote.pin(info)  # held until the pool closes this reader
        try:
            return self._format.open(path, self.manifest.sample, info.samples, self.store)
        except BaseException:
            self._remote.unpin(info)
            raise

    def _locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            if idx.size == 0:
                idx = idx.astype(np.int64)
            else:
                raise TypeError(f"dataset indices must be integers, got {idx.dtype}")
        idx = idx.astype(np.int64, copy=False).reshape(-1)
        n = len(self)
        bad = (idx < -n) | (idx >= n)
        if bad.any():
            raise IndexError(f"index {int(idx[bad][0])} is out of range for a dataset of {n} samples")
        idx = np.where(idx < 0, idx + n, idx)
        shards = np.searchsorted(self.shard_offsets, idx, side="right") - 1
        return idx, shards

    def read_samples(self, indices: Sequence[int] | np.ndarray) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each sample's image at its own size (ragged caches) and the labels, for ``indices``."""
        images, labels, _ = self._read_each(indices)
        return images, labels

    def _read_each(self, indices) -> tuple[list[torch.Tensor], torch.Tensor, list[dict] | None]:
        """Images at their own sizes, labels, and (caches with fields) each sample's target dict."""
        idx, shards = self._locate(indices)
        return read_each(self, shards.tolist(), (idx - self.shard_offsets[shards]).tolist())

    def read_batch(
        self, indices: Sequence[int] | np.ndarray, *, threads: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``[B, C, H, W]`` uint8 and labels ``[B]`` int64 for ``indices``, in that order.

        Pixel rows are copied straight from the memory-mapped shards into a recycled batch buffer;
        encoded samples are decoded, on ``threads`` threads over the batch.
        """
        if self.ragged:
            images, labels = self.read_samples(indices)
            return stack_images(images), labels
        batch = self.read_request(BatchRequest(indices, threads=threads))
        return batch.images, batch.labels

    def read_request(self, request: BatchRequest) -> SampleBatch:
        """A batch as ``make_loader`` asks for it: read, and augmented if its plan says so (a mosaic's
        extra samples, drawn once, read with it)."""
        extra = mosaic_extras(request, self)
        indices = read_rows(request, extra)
        with contextlib.ExitStack() as rows:
            with timed(clock(request.stages), "fetch"):
                readers, local, labels = rows.enter_context(self.borrowed_rows(indices))
            groups = lambda: self._groups(indices, readers, local)  # noqa: E731 -- read when there are fields
            read = BatchRead(indices, readers, local, labels, groups, self._buffers, extra, self._stats)
            return assemble(self, request, read)

    def _stats(self) -> tuple:
        """The cache's per-channel (mean, std) in [0, 1], as ``normalize=True`` uses them."""
        return getattr(self, "normalization", None) or (self.manifest.mean, self.manifest.std)

    def _groups(self, indices, readers: list, local: np.ndarray) -> list[tuple]:
        """Per shard of a batch: (positions in the batch, column reader, rows, samples, memo)."""
        _, shards = self._locate(indices)
        groups = []
        for shard in np.unique(shards).tolist():
            pos = np.flatnonzero(shards == shard)
            reader = readers[pos[0]]
            groups.append(
                (pos, reader.column, local[pos], self.manifest.shards[shard].samples, memo_of(reader))
            )
        return groups

    @contextlib.contextmanager
    def borrowed_rows(self, indices) -> Iterator[tuple[list, np.ndarray, np.ndarray]]:
        """``(readers, rows, labels)`` of ``indices``: sample ``j`` is row ``rows[j]`` of
        ``readers[j]``, borrowed from the reader pool until the block ends."""
        idx, shards = self._locate(indices)
        self._check_process()
        local = idx - self.shard_offsets[shards]
        labels = np.empty(len(idx), dtype=np.int64)
        readers: list = [None] * len(idx)
        borrowed = []
        needed = np.unique(shards).tolist()
        try:
            with self._waiting(needed):
                for shard in needed:
                    pos = np.flatnonzero(shards == shard)
                    reader = self._readers.borrow(shard, lambda shard=shard: self._open_reader(shard))
                    borrowed.append(reader)
                    info = self.manifest.shards[shard]
                    check_labels(reader.column, info.samples, len(self.classes), memo_of(reader))
                    labels[pos] = reader.column("labels", local[pos])
                    for j in pos.tolist():
                        readers[j] = reader
            yield readers, local, labels
        finally:
            for reader in borrowed:  # an evicted reader closes here, with the batch read
                self._readers.release(reader)

    def extras(self, index: int) -> dict[str, np.ndarray]:
        """Per-sample extras of one sample (``orig_size``; ``scale`` and ``pad`` for letterbox)."""
        idx, shards = self._locate([index])
        local = idx - self.shard_offsets[shards[0]]
        with self._reader(int(shards[0])) as reader:
            return {name: np.array(reader.column(name, local)[0]) for name in self.manifest.sample.extras}

    def source(self, index: int) -> str:
        """The path sample ``index`` was built from, relative to the raw folder given to the build
        (``/``-separated; a split's cache too: ``images/val/a.jpg``, ``train/cat/b.jpg``).

        A file name that is not UTF-8 comes back as ``os.fsdecode`` gives it (its bytes kept as
        lone surrogates), so ``os.path.join(raw, ds.source(i))`` opens that very file.
        """
        where = f"{self.url or self.root}/manifest.json"
        prefix = source_prefix(self.manifest.source, where)  # a split's folder within RAW
        idx, shards = self._locate([index])
        shard = int(shards[0])
        info = self.manifest.shards[shard]
        with self._reader(shard) as reader:
            row = int(idx[0] - self.shard_offsets[shard])
            return prefix + source_at(reader.column, row, info.samples, info.file)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"dataset index must be an integer, got {type(index).__name__}")
        if self.ragged:
            (image,), labels, targets = self._read_each([int(index)])
        else:
            batch = self.read_request(BatchRequest([int(index)]))
            image, labels, targets = batch.images[0], batch.labels, batch.targets
        target = int(labels[0]) if targets is None else tensors(list(targets)[0])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        if self.transforms is not None:
            image, target = self.transforms(image, target)
        return image, target

    def __getitems__(self, indices: Sequence[int]) -> list:
        plain = self.transform is None and self.target_transform is None and self.transforms is None
        request = indices if isinstance(indices, BatchRequest) else BatchRequest(indices)
        if not self.ragged or request.plan is not None or (plain and request is indices):
            batch = self.read_request(request)
            if plain:
                return batch
            images = batch.images
            labels = batch.labels  # soft labels (MixUp / CutMix) stay one tensor row per sample
            targets = (
                (labels.tolist() if labels.dim() == 1 else list(labels))
                if batch.targets is None
                else [tensors(t) for t in batch.targets.dicts()]
            )
        else:  # each at its own size: collate pads them or says why it cannot stack
            images, labels, found = self._read_each(indices)
            targets = labels.tolist() if found is None else [tensors(t) for t in found]
        pairs = []
        for image, target in zip(images, targets):
            image = self.transform(image) if self.transform is not None else image
            target = self.target_transform(target) if self.target_transform is not None else target
            if self.transforms is not None:
                image, target = self.transforms(image, target)
            pairs.append((image, target))
        return pairs

    def close(self) -> None:
        self._readers.close()
