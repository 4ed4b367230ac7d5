"""Samples read one at a time, each at its own size (a cache whose samples keep their sizes, read
without augmentation; a dataset's ``transform=`` path): images, labels and target dicts."""

from __future__ import annotations

import numpy as np
import torch

from ..store.encoding import read_sample
from .targets import check_labels, read_values, sample_target

__all__ = ["read_each", "memo_of", "tensors"]


def memo_of(reader) -> dict | None:
    """The dict kept with an open shard for what was read and checked of its fields whole (it goes
    with the reader: a shard opened again, changed or not, is read and checked again)."""
    try:
        return reader.__dict__.setdefault("field_memo", {})
    except AttributeError:
        return None


def tensors(target: dict) -> dict:
    """A sample's target with its arrays as tensors (each its own copy: masks may view a batch buffer)."""
    return {k: torch.from_numpy(np.array(v)) if isinstance(v, np.ndarray) else v for k, v in target.items()}


def read_each(dataset, shards: list[int], rows: list[int]) -> tuple[list[torch.Tensor], torch.Tensor, list[dict] | None]:
    """Each sample (row ``rows[j]`` of shard ``shards[j]``) read alone: images at their own sizes,
    labels, and (caches with fields) each sample's target dict."""
    images, labels = [], np.empty(len(rows), dtype=np.int64)
    targets = [] if dataset.fields else None
    for j, (shard, i) in enumerate(zip(shards, rows)):
        with dataset._reader(shard) as reader:
            images.append(
                torch.from_numpy(read_sample(reader.column, i, dataset.store, dataset.sample_shape[0]))
            )
            check_labels(
                reader.column, dataset.manifest.shards[shard].samples, len(dataset.classes), memo_of(reader)
            )
            labels[j] = reader.column("labels", [i])[0]
            if targets is not None:
                info = dataset.manifest.shards[shard]
                (values,) = read_values(
                    dataset.fields,
                    reader.column,
                    [i],
                    info.samples,
                    len(dataset.classes),
                    memo_of(reader),
                    shape=dataset.sample_shape,
                )
                targets.append(
                    sample_target(dataset.fields, values, info.file, tuple(images[-1].shape[-2:]))
                )
    return images, torch.from_numpy(labels), targets
