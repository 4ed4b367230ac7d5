"""The loader behind each ``cachekit bench`` row, plain or augmented: what each kind of user would run.

Plain rows read each sample as it is stored (the raw rows run the cache's recipe). With
``augment`` every row ends in the same work, a random resized crop to one size and a random
horizontal flip per sample, done the way each kind of user does it:

- raw files: PIL as torchvision's train transform does it, or OpenCV (a build's decode, the same
  crop parameters, ``cv2.resize``), per sample in the DataLoader's workers;
- a cache through a plain DataLoader: ``CachedDataset(path, transform=OpenCVRandomResizedCropFlip)``;
- a cache through ``make_loader(ds, B, augment=[RandomResizedCrop, RandomHorizontalFlip])``:
  batched, in threads of the training process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from torch.utils.data import DataLoader

from ..augment.transforms import RandomHorizontalFlip, RandomResizedCrop
from ..errors import UsageError
from ..feed.batch import collate_batch
from ..feed.dataset import CachedDataset
from ..feed.loader import make_loader
from .baselines import RRC_RATIO, RRC_SCALE, OpenCVRandomResizedCropFlip, RawImageDataset

__all__ = [
    "DEFAULT_AUGMENT_SIZE",
    "MAX_AUGMENT_SIZE",
    "AUGMENT_HOW",
    "augment_size",
    "augment_record",
    "raw_row",
    "cache_row",
    "make_loader_row",
]

#: Crop side of augmented rows when no cache has a fixed size to crop to (ImageNet training's).
DEFAULT_AUGMENT_SIZE = 224

#: The largest crop side ``--augment-size`` takes (a batch of 256 such crops is 12.9 GB).
MAX_AUGMENT_SIZE = 4096

#: How each kind of row augments, in words (the JSON and the table say it).
AUGMENT_HOW = {
    "raw-pil": "PIL per sample, as torchvision's RandomResizedCrop + RandomHorizontalFlip on the decoded file",
    "raw-opencv": "OpenCV per sample: a build's decode, torchvision's crop parameters, cv2.resize, flip",
    "cache": "per-sample transform=OpenCVRandomResizedCropFlip in a plain DataLoader",
    "make_loader": "make_loader(augment=[RandomResizedCrop, RandomHorizontalFlip]): batched, in threads",
}

#: What a row's factory returns: the loader and the extra fields its row records.
Factory = Callable[[], tuple[DataLoader, dict]]


def augment_size(
    config, paths: Sequence[str | os.PathLike], datasets: Sequence[CachedDataset]
) -> tuple[int, int] | None:
    """The (height, width) every row crops to for a ``BenchConfig``, or None for plain rows.

    ``config.augment_size`` wins; else the caches' own sample size when they are fixed-size (all
    the same), else ``DEFAULT_AUGMENT_SIZE``. Fixed-size caches of different sizes need
    ``--augment-size`` (UsageError).
    """
    if not config.augment:
        return None
    if config.augment_size is not None:
        return (config.augment_size, config.augment_size)
    fixed = {}
    for path, d in zip(paths, datasets):
        if not d.ragged:
            fixed.setdefault(tuple(int(v) for v in d.sample_shape[1:]), str(path))
    if len(fixed) > 1:
        some = ", ".join(f"{h}x{w} ({p})" for (h, w), p in list(fixed.items())[:3])
        raise UsageError(f"the caches hold samples of different sizes ({some}): give --augment-size")
    return next(iter(fixed)) if fixed else (DEFAULT_AUGMENT_SIZE, DEFAULT_AUGMENT_SIZE)


def augment_record(size: tuple[int, int], steps: list | None = None) -> dict:
    """What the augmented rows did, for the JSON: the crop, its parameters, and each row's way;
    ``steps``: an ``--augment SPEC``'s transforms, which the make_loader rows alone ran."""
    if steps is not None:
        from ..augment.spec import format_spec

        return {"size": list(size), "spec": format_spec(steps) or repr(steps), "how": {
            "make_loader": "make_loader(augment=SPEC): batched, in threads"}}  # fmt: skip
    return {
        "size": list(size),
        "scale": list(RRC_SCALE),
        "ratio": list(RRC_RATIO),
        "flip_p": 0.5,
        "how": dict(AUGMENT_HOW),
    }


def _plain(
    open_dataset: Callable, order: Sequence[int], workers: int, batch_size: int, collate=None
) -> Factory:
    extra = {"persistent_workers": True} if workers else {}
    kwargs = {"collate_fn": collate} if collate else {}

    def factory() -> tuple[DataLoader, dict]:
        loader = DataLoader(open_dataset(), batch_size, sampler=order, num_workers=workers, **extra, **kwargs)
        return loader, {}

    return factory


def raw_row(ds: RawImageDataset, order: Sequence[int], workers: int, batch_size: int) -> Factory:
    """Raw files decoded (and augmented, if ``ds.augment``) per sample, in ``order``."""
    return _plain(lambda: ds, order, workers, batch_size)


def cache_row(
    path: str | os.PathLike,
    order: Sequence[int],
    workers: int,
    batch_size: int,
    augment: tuple[int, int] | None,
    storage_options: dict | None = None,
) -> Factory:
    """The cache through a plain DataLoader, with the per-sample OpenCV crop + flip when augmenting.

    Each row opens the cache afresh (and the bench closes it after), so no earlier row's memory
    map keeps the files in the page cache when epoch 1 is meant to be cold. A URL cache is
    reached with ``storage_options``.
    """
    transform = OpenCVRandomResizedCropFlip(augment) if augment else None

    def open_dataset() -> CachedDataset:
        return CachedDataset(path, transform=transform, storage_options=storage_options)

    return _plain(open_dataset, order, workers, batch_size, collate_batch)


def make_loader_row(
    path: str | os.PathLike,
    batch_size: int,
    seed: int,
    augment: tuple[int, int] | None,
    storage_options: dict | None = None,
    steps: list | None = None,
) -> Factory:
    """The cache through ``make_loader``'s defaults, with ``augment=[RandomResizedCrop, flip]``, or
    ``steps`` when given (an ``--augment SPEC``)."""

    def factory() -> tuple[DataLoader, dict]:
        chosen = [RandomResizedCrop(augment), RandomHorizontalFlip()] if augment else None
        dataset = CachedDataset(path, storage_options=storage_options)
        loader = make_loader(
            dataset, batch_size, seed=seed, augment=list(steps) if steps is not None else chosen
        )
        return loader, {"mode": loader.mode}

    return factory
