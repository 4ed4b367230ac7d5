"""What ``make_loader`` checks and resolves before anything starts: its arguments, the dataset it is
given, the room worker processes need in /dev/shm, the batch's size, the seed, the timeout, where
augmentation runs, and every plan it reads with (``PlanCheck``).

Every refusal here is one line, raised before a worker, a thread or a download begins.
"""

from __future__ import annotations

import logging
import numbers
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from ..augment.opnames import worker_refusal
from ..augment.plan import AugmentUsageError, Plan
from ..constants import MAX_BATCH_BYTES
from .dataset import CachedDataset
from .rows import boxes_field
from .shm import ShmTooSmall, shm_shortfall
from .timeouts import READ_TIMEOUT_SECONDS

__all__ = [
    "PlanCheck",
    "check_counts",
    "check_timeout",
    "open_dataset",
    "batch_bytes",
    "fit_workers",
    "resolve_seed",
    "check_batch_bytes",
    "choose_augment_on",
    "check_augment_plan",
    "check_mosaic_targets",
]

log = logging.getLogger("cachekit")


def check_counts(**values: Any) -> None:
    """One line for an argument of the wrong kind, before anything is started."""
    lowest = {"batch_size": 1, "prefetch_factor": 1, "workers": 0, "threads": 1, "seed": None}
    for name, value in values.items():
        if value is None and name in ("workers", "threads", "seed"):
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if lowest[name] is not None and value < lowest[name]:
            raise ValueError(f"{name} must be at least {lowest[name]}, got {value}")
        if (
            name == "seed" and not -(2**63) <= value < 2**64
        ):  # torch.manual_seed's range (past it, seeds wrap onto others' draws)
            raise ValueError(f"seed must be from -2**63 to 2**64 - 1, as torch.manual_seed's, got {value}")


def check_timeout(timeout: float | None) -> float:
    """``timeout``, or ``READ_TIMEOUT_SECONDS`` when None: a positive, finite number of seconds."""
    timeout = READ_TIMEOUT_SECONDS if timeout is None else timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"timeout must be a positive number of seconds (a read never waits for ever), got {timeout!r}")
    return timeout


def open_dataset(dataset, storage_options: dict | None, split: str | None = None):
    """A path or URL opens a ``CachedDataset`` (``split``: one split's cache of a folder of them);
    anything else must be a map-style dataset."""
    if isinstance(dataset, (str, os.PathLike)):
        return CachedDataset(dataset, storage_options=storage_options, split=split)
    if split is not None:
        raise ValueError(
            "split= goes with a path or URL of a folder of split caches, not with a dataset object"
        )
    if storage_options:
        raise ValueError("storage_options go with a cache path or URL, not with a dataset object")
    if isinstance(dataset, IterableDataset) or not (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
    ):
        raise TypeError(
            f"make_loader takes a cache path or URL or a map-style dataset (with __getitem__ and "
            f"__len__, such as CachedDataset), not {type(dataset).__name__}"
        )
    return dataset


def batch_bytes(dataset, batch_size: int, plan: Plan | None) -> int | None:
    """Bytes of one batch as it is handed over from a worker process, or None when unknown."""
    spec = getattr(getattr(dataset, "manifest", None), "sample", None)
    if spec is None:
        return None
    size = plan.fixed_size() if plan is not None else None
    per_sample = spec.shape[0] * size[0] * size[1] if size else spec.nbytes
    return per_sample * batch_size


def fit_workers(workers: int, asked: bool, batch_bytes: int | None, prefetch_factor: int) -> int:
    """``workers``, or 0 with a warning when /dev/shm cannot hold their batches and none were asked
    for; asked-for workers that cannot fit are refused in one line (``ShmTooSmall``)."""
    why = shm_shortfall(batch_bytes, workers, prefetch_factor) if batch_bytes else None
    if why is None:
        return workers
    if asked:
        raise ShmTooSmall(why)
    warnings.warn(
        f"make_loader reads in-process instead of in {workers} worker processes: {why}", stacklevel=3
    )
    log.warning("make_loader: in-process reads: %s", why)
    return 0


def resolve_seed(seed: int | None, distributed: bool) -> int:
    """``seed``, or when None one from torch's (``torch.initial_seed()``, which ``torch.manual_seed``
    sets), made the same on every rank by a broadcast from rank 0 when ``distributed``."""
    if seed is not None:
        return int(seed)
    value = torch.initial_seed() & (2**63 - 1)
    if distributed:
        backend = dist.get_backend()
        device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        held = torch.tensor([value], dtype=torch.int64, device=device)
        dist.broadcast(held, src=0)
        value = int(held.item())
        # kept for good: a gloo thread that drops its last reference to a tensor Python has let go
        # of needs the GIL, which it cannot get while the interpreter exits (an abort)
        _BROADCAST.append(held)
    return value


_BROADCAST: list[torch.Tensor] = []


def check_batch_bytes(dataset, batch_size: int, plan: Plan | None) -> None:
    """Refuse, before anything is read, a batch larger than ``MAX_BATCH_BYTES`` (its images as
    uint8; a float dtype on the device is larger still)."""
    shape = getattr(getattr(getattr(dataset, "manifest", None), "sample", None), "shape", None)
    channels = int(shape[0]) if shape else 3
    size = plan.fixed_size() if plan is not None else None
    if size is None and shape and all(shape):
        size = (int(shape[1]), int(shape[2]))
    need = batch_size * channels * size[0] * size[1] if size else 0
    if need > MAX_BATCH_BYTES:
        raise ValueError(
            f"a batch of {batch_size} samples of {channels} x {size[0]} x {size[1]} is {need / 2**30:.1f} GiB, "
            f"over the limit of {MAX_BATCH_BYTES // 2**30} GiB: use a smaller batch_size or output size"
        )


def choose_augment_on(augment_on: str, device: torch.device | None, plan: Plan | None) -> bool:
    if augment_on not in ("auto", "threads", "device"):
        raise ValueError(f"augment_on must be 'auto', 'threads' or 'device', got {augment_on!r}")
    if augment_on == "device" and device is None:
        raise ValueError("augment_on='device' needs a device (device='cuda', or 'cpu' to test that path)")
    if plan is None:
        return False
    if augment_on == "auto" and plan.stage is not None and plan.stage.host_only:  # a PixelOp: numpy on threads
        return False
    return augment_on == "device" or (augment_on == "auto" and device is not None and device.type == "cuda")


def check_mosaic_targets(dataset, plan: Plan | None) -> None:
    """Refuse a ``Mosaic`` on a cache whose samples have no boxes and no masks: four images in one
    with one class (the first's) or none is no sample a model can learn from."""
    if plan is None or plan.mosaic is None:
        return
    kinds = {spec.kind for spec in (getattr(dataset, "fields", None) or {}).values()}
    if not kinds & {"boxes", "mask"}:
        has = f"targets are {', '.join(sorted(kinds))}" if kinds else "samples have a class each, or none"
        raise AugmentUsageError(
            f"Mosaic puts four samples in one and needs a cache with boxes or masks to follow them; this "
            f"cache's {has}: leave it out (MixUp or CutMix mix the samples of a classification cache)"
        )


def check_plan_pickles(plan: Plan | None, context=None) -> None:
    """Refuse, in one line, a plan whose user ops cannot travel to worker processes (a lambda or a
    function defined inside another; one of a notebook's, where workers do not start by fork,
    ``context`` the loader's ``multiprocessing_context``): each batch request carries its plan
    there, and one that does not pickle would leave the loader waiting for batches that never come."""
    if plan is None:
        return
    method = context if isinstance(context, str) or context is None else context.get_start_method()
    for step in plan.listed:
        if not hasattr(step, "spec_text"):  # the catalogue's transforms are plain data
            continue
        refusal = worker_refusal(step, fresh=method != "fork")
        if refusal is not None:
            raise AugmentUsageError(refusal)


def check_augment_plan(
    dataset, batch_size: int, plan: Plan | None, *, pad: bool, per_sample: bool, on_device: bool
) -> None:
    """Refuse, in one line, a plan this loader cannot read: checked for ``make_loader``'s
    ``augment``, each epoch's plan of a schedule, and each ``set_augment``."""
    check_batch_bytes(dataset, batch_size, plan)
    check_mosaic_targets(dataset, plan)
    ragged = bool(getattr(dataset, "ragged", False))
    if per_sample and on_device:
        raise ValueError(
            "augment on the device cannot run before a per-sample transform=; use augment_on='threads'"
        )
    if on_device and plan is not None and plan.stage is not None and plan.stage.host_only:
        raise AugmentUsageError(
            f"augment: {plan.stage.host_only[0]!r} runs numpy on each sample on CPU threads, not on the "
            "device: write it as BatchOp(fn) on the batch tensor, or pass augment_on='threads'"
        )
    if ragged and plan is not None and plan.fixed_size() is None:
        raise ValueError(
            "this cache keeps every sample at its own size, and augment must then end in a fixed "
            "size (Letterbox, RandomResizedCrop, CenterCrop or Resize((height, width))): pad=True pads "
            "samples read as stored, not augmented ones"
        )
    if not ragged and plan is not None and plan.fixed_size() is None and plan.size_varies():
        raise ValueError(
            "augment gives outputs of a different size for each sample (a RandomZoomOut, RandomIoUCrop "
            "or RandomRotation(expand=True) with no fixed size after it): end it with "
            "Letterbox, RandomResizedCrop, CenterCrop or Resize((height, width))"
        )
    if ragged and not pad and not per_sample and plan is None:
        raise ValueError(
            "this cache keeps every sample at its own size: pass pad=True (batches come zero-padded "
            "with their sizes) or an augment ending in a fixed size (Letterbox, RandomResizedCrop, "
            "CenterCrop or Resize((height, width)))"
        )


class PlanCheck:
    """Where a loader's plans run, and the check every one of them passes (``AugmentSchedule``'s
    ``check``): ``make_loader``'s ``augment``, each epoch's plan of a schedule, each ``set_augment``.

    A bad ``augment_on`` is refused when it is made, whatever the plan. Once the loader's worker
    processes are sized (``send_to_workers``), every later plan must also travel to them.
    """

    def __init__(self, dataset, batch_size: int, *, pad: bool, augment_on: str, device: torch.device | None) -> None:
        choose_augment_on(augment_on, device, None)
        self.dataset, self.batch_size, self.pad = dataset, batch_size, pad
        self.augment_on, self.device = augment_on, device
        #: A per-sample ``transform=`` of the dataset's own runs on each sample before any batch work.
        self.per_sample = any(
            getattr(dataset, a, None) is not None for a in ("transform", "target_transform", "transforms")
        )
        self.workers, self.context = 0, None  # known once the first plan has sized them

    def on_device(self, plan: Plan | None) -> bool:
        """True where ``plan`` runs on the loader's device, False on CPU threads (or no plan)."""
        return choose_augment_on(self.augment_on, self.device, plan)

    def send_to_workers(self, workers: int, context) -> None:
        """Later plans go to ``workers`` worker processes started by ``context``."""
        self.workers, self.context = workers, context

    def __call__(self, plan: Plan | None) -> None:
        if self.workers > 0:  # a later plan (set_augment, a schedule) goes to the same workers
            check_plan_pickles(plan, self.context)
        check_augment_plan(
            self.dataset, self.batch_size, plan, pad=self.pad, per_sample=self.per_sample, on_device=self.on_device(plan)
        )
        if plan is not None and plan.mix is not None:  # CutMix on boxes, MixUp on masks alone: one line
            fields, classes = getattr(self.dataset, "fields", {}), getattr(self.dataset, "classes", None)
            plan.mix.check_cache(fields, len(classes or ()))
        if plan is not None and plan.needs_boxes:  # an IoU crop: here, not at the first batch (in a worker)
            boxes_field(self.dataset)
