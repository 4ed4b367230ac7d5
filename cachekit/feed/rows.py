"""The rows a batch reads: its own samples, then (a ``Mosaic``) each sample's extra samples.

A mosaic's three extra samples are drawn once per batch (``mosaic_extras``), read after the
request's own (``read_rows``) and known to the batch's work by position; an IoU crop draws from
the boxes of a cache that has them (``boxes_field``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["mosaic_extras", "read_rows", "read_indices", "boxes_field"]


def mosaic_extras(request, dataset) -> np.ndarray | None:
    """``[n, 3]`` the dataset indices of each sample's mosaic besides its own (-1: none), or None.

    Drawn over the whole dataset; from a cache on object storage, over the samples of the shards
    the batch reads anyway (``dataset.mosaic_pool``), as Ultralytics draws them from the images it
    loaded last: uniform extras would pin and download three more shards a sample."""
    plan = getattr(request, "plan", None)
    if plan is None or plan.mosaic is None:
        return None
    idx = np.asarray(request, dtype=np.int64)
    pool = dataset.mosaic_pool(idx) if hasattr(dataset, "mosaic_pool") else None
    return plan.extra_indices(request.seed, request.epoch, idx, len(dataset), pool)


def read_rows(request, extra: np.ndarray | None) -> list[int]:
    """The indices a request reads: its own, then (``extra``: ``mosaic_extras``) the extra samples
    each sample's mosaic takes, sample by sample."""
    if extra is None:
        return list(request)
    return list(request) + extra[extra[:, 0] >= 0].reshape(-1).tolist()


def read_indices(request, dataset) -> list[int]:
    """The indices a request reads of ``dataset`` (``read_rows`` of its ``mosaic_extras``)."""
    return read_rows(request, mosaic_extras(request, dataset))


def boxes_field(dataset) -> str:
    """The name of ``dataset``'s boxes field, which ``RandomIoUCrop`` draws from (one line without)."""
    names = [name for name, spec in getattr(dataset, "fields", {}).items() if spec.kind == "boxes"]
    if not names:
        raise ValueError("RandomIoUCrop needs a cache with boxes (cachekit build --annotations ...)")
    return names[0]
