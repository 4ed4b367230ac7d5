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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import CacheError
from ..store.encoding import RAW_STORES, STORES, read_sample
from ..store.formats import ShardReader, get_format
from ..store.location import read_manifest
from ..store.manifest import Manifest, shard_path
from ..store.remote import is_url
from ..store.sourcecol import source_at, source_prefix
from ..store.splitdirs import split_path, splits_error
from ..stream.pins import bytes_per_batch, shards_per_batch
from ..stream.remotecache import RemoteShards, index_folder
from .assemble import BatchRead, BatchRequest, assemble
from .batch import SampleBatch, stack_images
from .buffers import BufferPool
from .readers import ReaderPool, default_max_open
from .rows import mosaic_extras, read_rows
from .targets import check_labels, read_values, sample_target

__all__ = ["CachedDataset"]


def _tensors(target: dict) -> dict:
    """A sample's target with its arrays as tensors (each its own copy: masks may view a batch buffer)."""
    return {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in target.items()}


def _memo_of(reader) -> dict | None:
    """The dict kept with an open shard for what was read and checked of its fields whole (it goes
    with the reader: a shard opened again, changed or not, is read and checked again)."""
    try:
        return reader.__dict__.setdefault("field_memo", {})
    except AttributeError:
        return None


class CachedDataset(Dataset):
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
        if split is not None:  # one cache of a folder of split caches (a build of a RAW naming splits)
            path = split_path(path, split)
        self.url = str(path).rstrip("/") if is_url(path) else None
        if self.url is None:
            self.root = Path(path)
            if split is None and (error := splits_error(path)) is not None:
                raise error
            self.manifest: Manifest = read_manifest(self.root)
            self._remote = None
        else:
            self.manifest = read_manifest(
                self.url, storage_options=storage_options, index_folder=index_folder(local_cache)
            )
            self._remote = RemoteShards(
                self.url,
                self.manifest,
                storage_options=storage_options,
                local_cache=local_cache,
                local_cache_bytes=local_cache_bytes,
            )
            self.root = self._remote.cache.folder
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

    def _checked_path(self, info) -> Path:
        """A local shard's path, checked when a reader first opens it (never all at start-up): a
        regular file or folder of files inside the cache, of the manifest's size."""
        try:
            path = shard_path(self.root, info)
            size = path.stat().st_size if path.is_file() else None
        except CacheError as exc:
            raise CacheError(f"{self.root}: shard {info.file} {exc}") from None
        except OSError as exc:
            raise CacheError(
                f"{self.root}: shard {info.file} cannot be read ({exc.strerror or exc})"
            ) from None
        if size is not None and size != info.bytes:
            raise CacheError(
                f"{self.root}: shard {info.file} is {size} bytes, the manifest says {info.bytes} "
                "(changed since the build: rebuild, or restore it)"
            )
        return path

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
            return self._format.open(self._checked_path(info), self.manifest.sample, info.samples, self.store)
        path = self._remote.pin(info)  # held until the pool closes this reader
        try:
            return self._format.open(path, self.manifest.sample, info.samples, self.store)
        except BaseException:
            self._remote.unpin(info)
            raise

    # -- downloads ahead (caches on object storage) ---------------------------------------------

    def check_batch_shards(
        self, batch_size: int, window: int, processes: int, *, world: int = 1, partitions: int = 1
    ) -> None:
        """For a cache on object storage: refuse batches that would pin more shards than fit.

        Each of ``processes`` reading processes on the node pins the shards of the batch it reads:
        at most ``stream.pins.shards_per_batch`` of them (blocks of ``window`` samples, ``world``
        ranks over ``partitions`` node partitions).
        """
        if self._remote is None:
            return
        touched = shards_per_batch(self.shard_offsets, batch_size, window, world=world, partitions=partitions)
        sizes = [s.bytes for s in self.manifest.shards]
        most = bytes_per_batch(
            self.shard_offsets, sizes, batch_size, window, world=world, partitions=partitions
        )
        self._remote.check_pins(touched, processes, most)

    def shard_pool(self, indices) -> np.ndarray:
        """Every index of the shards ``indices`` lie in, in order."""
        _, shards = self._locate(indices)
        ranges = [
            np.arange(self.shard_offsets[k], self.shard_offsets[k + 1]) for k in np.unique(shards).tolist()
        ]
        return np.concatenate(ranges).astype(np.int64) if ranges else np.zeros(0, np.int64)

    def mosaic_pool(self, indices) -> np.ndarray | None:
        """Where a mosaic's extra samples come from for a batch of ``indices``: a cache on object
        storage offers the samples of the shards the batch pins anyway (None: anywhere)."""
        return self.shard_pool(indices) if self.remote else None

    @property
    def remote(self) -> bool:
        """True when the shards are fetched into a node cache (a cache named by a URL)."""
        return self._remote is not None

    def block_shards(self, processes: int = 1) -> int | None:
        """Shards the sampler shuffles together by default on object storage, ``processes`` reading
        processes on the node pinning theirs (None: a local cache)."""
        return None if self._remote is None else self._remote.block_shards(processes)

    def plan_reads(self, indices, following: Callable[[], np.ndarray] | None = None) -> None:
        """This process will read ``indices`` in this order (then ``following()``'s, the next
        epoch's): fetch their shards ahead of need, and let the node cache evict by that order."""
        if self._remote is not None and len(indices):
            self._remote.fetcher(self.shard_offsets).plan(indices, following)

    def reading(self, indices) -> None:
        """A batch of ``indices`` is being read now: the lookahead moves past its shards."""
        if self._remote is not None and len(indices):
            self._remote.fetcher(self.shard_offsets).advance(indices)

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
        images, labels = [], np.empty(len(idx), dtype=np.int64)
        targets = [] if self.fields else None
        for j, (shard, i) in enumerate(zip(shards.tolist(), (idx - self.shard_offsets[shards]).tolist())):
            with self._reader(shard) as reader:
                images.append(
                    torch.from_numpy(read_sample(reader.column, i, self.store, self.sample_shape[0]))
                )
                check_labels(
                    reader.column, self.manifest.shards[shard].samples, len(self.classes), _memo_of(reader)
                )
                labels[j] = reader.column("labels", [i])[0]
                if targets is not None:
                    info = self.manifest.shards[shard]
                    (values,) = read_values(
                        self.fields,
                        reader.column,
                        [i],
                        info.samples,
                        len(self.classes),
                        _memo_of(reader),
                        shape=self.sample_shape,
                    )
                    targets.append(
                        sample_target(self.fields, values, info.file, tuple(images[-1].shape[-2:]))
                    )
        return images, torch.from_numpy(labels), targets

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
        with self.borrowed_rows(indices) as (readers, local, labels):
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
                (pos, reader.column, local[pos], self.manifest.shards[shard].samples, _memo_of(reader))
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
                    check_labels(reader.column, info.samples, len(self.classes), _memo_of(reader))
                    labels[pos] = reader.column("labels", local[pos])
                    for j in pos.tolist():
                        readers[j] = reader
            yield readers, local, labels
        finally:
            for reader in borrowed:  # an evicted reader closes here, with the batch read
                self._readers.release(reader)

    def _waiting(self, shards: list[int]):
        """A cache on object storage: the shards of a batch not on the node are demanded together."""
        if self._remote is None:
            return contextlib.nullcontext()
        return self._remote.waiting([self.manifest.shards[k] for k in shards])

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
        target = int(labels[0]) if targets is None else _tensors(list(targets)[0])
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
                else [_tensors(t) for t in batch.targets.dicts()]
            )
        else:  # each at its own size: collate pads them or says why it cannot stack
            images, labels, found = self._read_each(indices)
            targets = labels.tolist() if found is None else [_tensors(t) for t in found]
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
