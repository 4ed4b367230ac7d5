"""What a batch is: ``SampleBatch`` (a batch read in one go) and the collate functions for it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from ..errors import UsageError
from ..store.fields import FieldSpec
from .batchtargets import BatchTargets
from .stages import clock
from .targets import COLLATES, collate_targets, yolo_batch

__all__ = ["SampleBatch", "Collate", "collate_batch", "collate_padded", "pad_collate", "stack_images"]


class CollateError(UsageError, ValueError):
    """Targets a collate cannot give as asked (a transform's that lost a field): one line, also when
    raised in a worker process (a ``UsageError``), and a ``ValueError`` as the loader's refusals are."""


class SampleBatch(list):
    """A batch read in one go: ``.images`` uint8 ``[B, C, H, W]`` and ``.labels`` int64 ``[B]``.

    It is also a list of ``(image, label)`` pairs (built on first use), so torch's default collate
    works unchanged; ``collate_batch`` skips that and returns the stacked tensors directly.
    ``.aux``: what the loader still has to do on the device (augmentation parameters), or padded
    samples' own sizes; None for a plain batch. A cache with fields besides the class also gives
    ``.targets`` (``BatchTargets``: made per-sample dicts at collate), and through it ``.masks``
    (each mask field's ``[B, H, W]`` buffer), ``.fields`` and ``.image_hw`` (each sample's size,
    unpadded).
    """

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, aux: dict | None = None, targets: BatchTargets | None = None
    ) -> None:
        super().__init__()
        self.images = images
        self.labels = labels
        self.aux = aux
        self.targets = targets
        self._filled = False

    @property
    def fields(self) -> dict | None:
        return self.targets.fields if self.targets is not None else None

    @property
    def masks(self) -> dict | None:
        return self.targets.masks if self.targets is not None else None

    @property
    def image_hw(self) -> list | None:
        return self.targets.image_hw if self.targets is not None else None

    def _fill(self) -> None:
        if not self._filled:
            self._filled = True
            if self.targets is None:
                labels = self.labels.tolist() if self.labels.dim() == 1 else list(self.labels)  # soft: rows
                super().extend(zip(self.images, labels))
            else:
                super().extend(zip(self.images, (_tensors(t) for t in self.targets.dicts())))

    def __len__(self) -> int:
        return len(self.labels)

    def __iter__(self):
        self._fill()
        return super().__iter__()

    def __getitem__(self, i):
        self._fill()
        return super().__getitem__(i)

    def __reduce__(self):
        return (SampleBatch, (self.images, self.labels, self.aux, self.targets))


def _tensors(target: dict) -> dict:
    """A target dict with its arrays as tensors (text stays text)."""
    return {k: torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v for k, v in target.items()}


def stack_images(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.stack`` for images, with an error that says what to do when their sizes differ."""
    shapes = {tuple(t.shape) for t in images}
    if len(shapes) > 1:
        some = ", ".join(str(list(s)) for s in sorted(shapes)[:3])
        raise ValueError(
            f"cannot stack images of different sizes ({some}, ...): this cache keeps every sample at "
            "its own size; use make_loader(..., pad=True) or collate_fn=cachekit.pad_collate, "
            "batch_size=1, or build with a fixed-size recipe"
        )
    return torch.stack(list(images)) if images else torch.empty(0, dtype=torch.uint8)


def _fields_batch(batch: SampleBatch, mode: str):
    """``(images, targets[, aux | sizes])`` of a batch whose samples have fields. YOLO rows are
    normalised to the batch tensor's own size (padded samples: the padded size, as a loss sees it);
    a batch the device will augment is normalised to the size it will have (``image_hw``), not to
    the stored images it carries there."""
    if mode == "yolo":
        padded = isinstance(batch.aux, dict) and set(batch.aux) == {"sizes"}
        hw = [tuple(batch.images.shape[-2:])] * len(batch) if padded else None
        targets = yolo_batch(batch.fields, batch.targets.dicts(), hw or batch.image_hw)
    else:
        targets = collate_targets(batch.fields, batch.targets.dicts(), batch.masks)
    if batch.aux is None:
        return batch.images, targets
    if isinstance(batch.aux, dict) and set(batch.aux) == {"sizes"}:
        return batch.images, targets, batch.aux["sizes"]
    return batch.images, targets, batch.aux


def _pairs_targets(targets: list, mode: str, hw, fields: dict | None = None) -> Any:
    """Per-sample targets of pairs (a ``transform=``): classes collated, field dicts kept as a list;
    ``collate="yolo"``: Ultralytics' rows, or its pose batch when the targets carry keypoints."""
    if targets and isinstance(targets[0], dict):
        if mode == "yolo":
            return yolo_batch(*_yolo_pairs(targets, fields), hw)
        return [_tensors(t) for t in targets]
    return default_collate(targets)


def _yolo_pairs(targets: list[dict], fields: dict | None) -> tuple[dict, list[dict]]:
    """The fields ``yolo_batch`` reads from targets a per-sample transform returned: the boxes, and the
    keypoints with their ``K`` (the cache's ``fields``, else what the targets hold). A transform that
    drops the cache's keypoints, or returns another number of point blocks than boxes: one line."""
    fields = fields or {}
    boxes = next((n for n, s in fields.items() if s.kind == "boxes"), "boxes")
    points = next((n for n, s in fields.items() if s.kind == "keypoints"), None)
    found = {boxes: FieldSpec("boxes")} if boxes in targets[0] else {}
    name = points or ("keypoints" if "keypoints" in targets[0] and boxes == "boxes" else None)
    if name is None or not found:
        return found, targets
    if any(name not in t for t in targets):
        raise CollateError(
            f'collate="yolo": this cache has keypoints ({name!r}), and the targets your transform returned '
            f'lack them: return target[{name!r}] moved with the image ([N, K, 3]), or use collate="auto"'
        )
    values = [np.asarray(t[name], dtype=np.float32) for t in targets]
    k = fields[name].params["k"] if points else values[0].shape[1] if values[0].ndim == 3 else 0
    for i, (t, v) in enumerate(zip(targets, values)):
        n = len(np.asarray(t[boxes]).reshape(-1, 4))
        if v.ndim != 3 or v.shape[1:] != (k, 3) or len(v) != n:
            raise CollateError(
                f'collate="yolo": sample {i} of the batch has {n} boxes and {name!r} of shape {list(v.shape)} '
                f"from your transform; Ultralytics' pose batch needs [{n}, {k}, 3], one block of points per box"
            )
    found[name] = FieldSpec("keypoints", {"boxes": boxes, "k": k})
    return found, targets


class Collate:
    """``make_loader``'s collate: batches read whole pass through already stacked; ``pad`` pads
    per-sample pairs (a ``transform=``) of different sizes; ``targets`` is ``"auto"`` or ``"yolo"``;
    ``fields``: the cache's, so that ``"yolo"`` gives the pose batch of pairs whose targets a
    transform returned (and says so when it dropped the keypoints). ``stages``: a profiled loader's
    ``StageLog`` folder, where each call is timed (``feed.stages``)."""

    def __init__(
        self, *, pad: bool = False, targets: str = "auto", fields: dict | None = None, stages: str | None = None
    ) -> None:
        if targets not in COLLATES:
            raise ValueError(f"collate must be one of {', '.join(COLLATES)}, got {targets!r}")
        self.pad, self.targets = pad, targets
        self.fields = fields  # the cache's fields: what a transform's targets should still carry
        self.stages = stages

    def __call__(self, batch: Any) -> Any:
        stage_clock = clock(self.stages)
        if stage_clock is None:
            return self._collate(batch)
        with stage_clock.stage("collate"):
            out = self._collate(batch)
        stage_clock.flush()  # the batch's last stage in a worker process
        return out

    def _collate(self, batch: Any) -> Any:
        if isinstance(batch, SampleBatch):
            if batch.targets is not None:
                return _fields_batch(batch, self.targets)
            if batch.aux is None:
                return batch.images, batch.labels
            if isinstance(batch.aux, dict) and set(batch.aux) == {
                "sizes"
            }:  # variable-sized samples, already padded: as pad_collate gives
                return batch.images, batch.labels, batch.aux["sizes"]
            return batch.images, batch.labels, batch.aux
        if batch and isinstance(batch[0], tuple) and isinstance(batch[0][0], torch.Tensor):
            hw = [tuple(b[0].shape[-2:]) for b in batch]
            if self.pad:
                images, _, sizes = pad_collate([(b[0], 0) for b in batch])
                hw = [tuple(images.shape[-2:])] * len(batch)  # YOLO rows: the padded size, as a loss sees it
                return images, _pairs_targets([b[1] for b in batch], self.targets, hw, self.fields), sizes
            images = stack_images([b[0] for b in batch])
            return images, _pairs_targets([b[1] for b in batch], self.targets, hw, self.fields)
        return default_collate(batch)


#: Collate for DataLoaders over a CachedDataset: a SampleBatch is already stacked. A batch with work
#: left for the loader's device stage comes as ``(images, labels, aux)``.
collate_batch = Collate()
#: ``make_loader(pad=True)``'s collate: batches read whole pass through (variable-sized ones come
#: padded, with their sizes); per-sample pairs (a ``transform=``) are padded by ``pad_collate``.
collate_padded = Collate(pad=True)


def pad_collate(batch: Sequence[tuple[torch.Tensor, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images of different sizes zero-padded (bottom and right) to the largest in the batch.

    Returns ``(images [B, C, Hmax, Wmax], labels [B], sizes [B, 2])``: each image's own height and
    width, so the padding can be masked.
    """
    images = [b[0] for b in batch]
    sizes = torch.tensor([list(t.shape[-2:]) for t in images], dtype=torch.int64)
    h, w = (int(v) for v in sizes.max(dim=0).values) if len(images) else (0, 0)
    out = torch.zeros(
        (len(images), images[0].shape[0] if images else 0, h, w),
        dtype=images[0].dtype if images else torch.uint8,
    )
    for i, t in enumerate(images):
        out[i, :, : t.shape[-2], : t.shape[-1]] = t
    targets = [b[1] for b in batch]
    if targets and isinstance(targets[0], dict):  # fields of different sizes: one dict per sample
        return out, [_tensors(t) for t in targets], sizes
    return out, default_collate(targets), sizes
