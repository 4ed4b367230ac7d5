"""PyTorch Lightning: ``CacheDataModule``, a ``LightningDataModule`` over the splits of one ``cachekit build``.

Each loader is ``make_loader``'s, made in the hook Lightning calls on every rank once its process
group is up, so each rank reads its own equal share. Three things Lightning does to a loader are
met here, not left to the user:

- **Sampler injection.** Under DDP, Lightning puts a ``DistributedSampler`` in front of a loader's
  sampler unless it is one; ``make_loader``'s sampler is one (``feed.sampler``), so the loader is
  left as it is: no second sharding, and Lightning's ``set_epoch`` reaches the sampler each epoch.
- **The loader's state in a checkpoint.** Lightning saves a stateful training loader's
  ``state_dict()`` with the loops and loads it into the new loader on resume; a checkpoint saved
  between steps resumes at the next batch (Lightning reads no batch ahead of a loader with a
  length, so the loader's count of batches delivered is the loop's). Lightning skips that reload
  when ``configure_optimizers`` has read ``trainer.estimated_stepping_batches`` (it makes the loader
  before it restores the loops): so the module keeps the same state in its own ``state_dict`` and
  gives it to the first training loader it makes after a restore; where Lightning reloads it too,
  it loads the same state. A resumed epoch's loader gives only the batches left, but its ``len()``
  stays the whole epoch's (``CacheLoader.whole_epoch_len``): Lightning adds the batches it ran
  before the resume to what it counts, and would end the epoch early otherwise.
- **The device.** On a CUDA trainer the loader copies each batch to the rank's device itself
  (pinned, on a side stream, GPU augmentation), so Lightning's own transfer has nothing left to do.

Lightning is the ``[lightning]`` extra, imported when ``CacheDataModule`` is first asked for; a
version the module was not written for is refused in one line (``versions.SUPPORTED``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
import torch.distributed as dist

from ..constants import DIST_NAME
from ..errors import UsageError
from ..feed.cacheloader import CacheLoader
from ..feed.loader import make_loader, resolve_seed
from ..store.remote import is_url
from ..store.splitdirs import cache_splits, split_path
from .versions import check_version

__all__ = ["CacheDataModule", "datamodule_class", "split_caches", "lightning_pytorch"]  # noqa: F822 (made on first use)

#: The stages a module reads, each the split its loader is made from.
STAGES = ("train", "val", "test")


def lightning_pytorch():
    """``lightning.pytorch``, of a version this module supports; otherwise one line saying how to get one."""
    try:  # optional: the [lightning] extra
        import lightning
        import lightning.pytorch
    except ImportError:
        raise UsageError(f"CacheDataModule needs lightning: pip install '{DIST_NAME}[lightning]'") from None
    check_version("lightning", lightning.__version__, f"pip install '{DIST_NAME}[lightning]'")
    return lightning.pytorch


def split_caches(
    cache: str | os.PathLike | None,
    train: str | os.PathLike | None = None,
    val: str | os.PathLike | None = None,
    test: str | os.PathLike | None = None,
) -> dict[str, str | None]:
    """The cache each stage reads (None: the stage has none).

    With ``cache`` a folder of split caches (what a build of a RAW naming splits writes), ``train``,
    ``val`` and ``test`` name its splits (default ``train``, and ``val``/``test`` where the folder
    has them; a URL's splits must be named); a split it does not hold is one line. With ``cache``
    one cache, it is the training cache. Without ``cache``, they are the caches' paths or URLs.
    """
    given = {"train": train, "val": val, "test": test}
    if cache is None:
        if train is None:
            raise UsageError("CacheDataModule needs a folder of split caches, or train= a cache's path")
        return {stage: None if path is None else os.fspath(path) for stage, path in given.items()}
    found = cache_splits(cache)
    if not found and not is_url(os.fspath(cache)):
        if any(name is not None for name in given.values()):
            raise UsageError(
                f"{os.fspath(cache)} is one cache, not a folder of splits: give train=, val=, test= as "
                "paths without a cache"
            )
        return {"train": os.fspath(cache), "val": None, "test": None}
    names = {"train": train if train is not None else "train"}
    for stage in ("val", "test"):
        names[stage] = given[stage] if given[stage] is not None else (stage if stage in found else None)
    return {
        stage: None if name is None else split_path(cache, os.fspath(name)) for stage, name in names.items()
    }


class _CacheData:
    """What ``CacheDataModule`` does; the class Lightning sees puts ``LightningDataModule`` after it."""

    def __init__(
        self,
        cache: str | os.PathLike | None = None,
        *,
        batch_size: int,
        train: str | os.PathLike | None = None,
        val: str | os.PathLike | None = None,
        test: str | os.PathLike | None = None,
        augment: Any = None,
        val_augment: Any = None,
        val_batch_size: int | None = None,
        seed: int | None = None,
        **loader_options: Any,
    ) -> None:
        super().__init__()
        for taken in ("shuffle", "distributed", "split", "drop_last"):
            if taken in loader_options:
                raise UsageError(
                    f"CacheDataModule sets {taken}= itself (training shuffles, evaluation does not)"
                )
        #: The cache each stage reads (None: none).
        self.caches = split_caches(cache, train, val, test)
        self.batch_size, self.val_batch_size = int(batch_size), int(val_batch_size or batch_size)
        self.augment, self.val_augment = augment, val_augment
        self.seed = seed
        self.loader_options = loader_options
        self._train: CacheLoader | None = None  # the training loader made last (its state is saved)
        self._resume: dict | None = None  # a restored checkpoint's state, for the next training loader

    def setup(self, stage: str | None = None) -> None:
        """One seed for every loader of the run, the same on every rank (rank 0's; ``torch.manual_seed``
        or Lightning's ``seed_everything`` sets it)."""
        self.seed = resolve_seed(self.seed, dist.is_available() and dist.is_initialized())

    def _loader(self, stage: str, *, train: bool) -> CacheLoader:
        options = dict(self.loader_options)
        device = options.pop("device", self._device())
        return make_loader(
            self.caches[stage],
            self.batch_size if train else self.val_batch_size,
            shuffle=train,
            drop_last=False,
            seed=self.seed,
            augment=self.augment if train else self.val_augment,
            device=device,
            **options,
        )

    def _device(self) -> torch.device | None:
        """The rank's CUDA device when the trainer runs on one (the loader copies there itself), else None."""
        trainer = getattr(self, "trainer", None)
        root = getattr(getattr(trainer, "strategy", None), "root_device", None)
        return root if isinstance(root, torch.device) and root.type == "cuda" else None

    def train_dataloader(self) -> CacheLoader:
        loader = self._loader("train", train=True)
        loader.whole_epoch_len = True  # Lightning adds the batches run before a resume to what it counts
        if self._resume is not None:  # whether or not Lightning reloads the loader's state itself
            loader.load_state_dict(self._resume)
            self._resume = None
        self._train = loader
        return loader

    def val_dataloader(self) -> CacheLoader | list:
        return self._loader("val", train=False) if self.caches["val"] else []

    def test_dataloader(self) -> CacheLoader | list:
        return self._loader("test", train=False) if self.caches["test"] else []

    def state_dict(self) -> dict:
        """Where the training loader is in its epoch (Lightning saves it in every checkpoint)."""
        return {"train": self._train.state_dict()} if self._train is not None else {}

    def load_state_dict(self, state: dict) -> None:
        """Resume the next training loader made at the saved position."""
        self._resume = state.get("train")


@functools.cache
def datamodule_class() -> type:
    """``CacheDataModule``: made once, on first use, over the installed ``LightningDataModule``."""
    pl = lightning_pytorch()
    cls = type("CacheDataModule", (_CacheData, pl.LightningDataModule), {"__module__": __name__})
    cls.__doc__ = _DOC
    return cls


_DOC = """A ``LightningDataModule`` over the train, val and test splits of one ``cachekit build``.

``CacheDataModule(cache, batch_size=..., augment=[...], val_augment=[...])``: ``cache`` a folder of
split caches (``train``/``val``/``test`` name its splits), one cache (training only), or None with
``train=``, ``val=``, ``test=`` caches' paths. Training loaders shuffle (a new order every epoch, set
by the trainer) with ``augment``; evaluation loaders read in order with ``val_augment`` and
``val_batch_size``. Every other keyword is ``make_loader``'s (``workers``, ``normalize``, ``dtype``,
``channels_last``, ``device``, ...). Under ``strategy="ddp"`` each rank reads its own equal share, and
a checkpoint saved between training steps resumes the training loader at the next batch.
"""


def __getattr__(name: str):
    if name == "CacheDataModule":  # Lightning imported only now: the module imports without it
        return datamodule_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
