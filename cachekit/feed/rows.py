"""One augmented sample of a batch: what its draws need, its pixels into its row, its target's masks.

A batch whose plan has general maps or a mosaic (``cachekit.augment.maps``) reads more than its own
rows: a mosaic's three extra samples come after the request's own (``read_indices``), and an IoU
crop draws from each sample's boxes, read before the draws (``draw_batch``). ``Rows`` is what a
thread over the batch does per sample: its pixels, as the draws' ``SampleWork`` does them (a
mosaic's canvas, the crop+resize path or one warp, colour, the pixel stage), and its masks (a
mosaic's canvas of masks) through the same map.
"""

from __future__ import annotations

import numpy as np

from .targets import move_target, sample_target

__all__ = ["read_indices", "draw_batch", "boxes_field", "Rows"]


def _extras(request, dataset) -> np.ndarray | None:
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


def read_indices(request, dataset) -> list[int]:
    """The indices a request reads of ``dataset``: its own, then (a mosaic) the extra samples each
    sample takes, sample by sample (``assemble`` knows them by position)."""
    extra = _extras(request, dataset)
    if extra is None:
        return list(request)
    return list(request) + extra[extra[:, 0] >= 0].reshape(-1).tolist()


def boxes_field(dataset) -> str:
    """The name of ``dataset``'s boxes field, which ``RandomIoUCrop`` draws from (one line without)."""
    names = [name for name, spec in getattr(dataset, "fields", {}).items() if spec.kind == "boxes"]
    if not names:
        raise ValueError("RandomIoUCrop needs a cache with boxes (cachekit build --annotations ...)")
    return names[0]


def draw_batch(dataset, request, readers, local, heights, widths, values, whole: bool):
    """``(draws, early)``: the batch's draws (None without a plan) and, when an IoU crop drew from
    the boxes of a cache without masks, its targets as read (to be moved after the pixels)."""
    plan, n = request.plan, len(request)
    if not plan:
        return None, None
    early, boxes = None, None
    if plan.needs_boxes:
        name = boxes_field(dataset)
        if values is not None:
            boxes = [np.asarray(v[name]["boxes"]).reshape(-1, 4) for v in values[:n]]
        elif whole:
            early = dataset.batch_targets(read_indices(request, dataset), readers, local, None, 0.0)
            boxes = [t[name].numpy() for t in early]
    extra = _extras(request, dataset)
    extra_hw = None
    if extra is not None:
        extra_hw = np.zeros((n, 3, 2), np.int64)
        extra_hw[extra[:, 0] >= 0] = np.stack([heights[n:], widths[n:]], axis=1).reshape(-1, 3, 2)
    draws = plan.draw(request.seed, request.epoch, np.asarray(request, dtype=np.int64), heights[:n], widths[:n],
                      extra=extra, extra_hw=extra_hw, boxes=boxes)  # fmt: skip
    return draws, early


class Rows:
    """A batch's augmented samples, one at a time (each thread takes some): ``out`` the batch buffer,
    ``source(r)`` row ``r``'s stored image ``(array, channels_last)``, ``targets`` the batch's list
    (a mosaic's extra rows get theirs, for their boxes to join the sample's)."""

    def __init__(
        self,
        dataset,
        draws,
        out,
        on_threads: bool,
        heights,
        widths,
        source,
        masks,
        targets,
        indices,
        min_visibility,
        stage=None,
    ):
        self.dataset, self.draws, self.out, self.on_threads = dataset, draws, out, on_threads
        self.heights, self.widths, self.source = heights, widths, source
        self.masks, self.targets, self.indices, self.min_visibility = masks, targets, indices, min_visibility
        self.work = draws.sample_work(out, on_threads, heights, widths, source, stage)

    def pixels(self, j: int, src: np.ndarray, hwc: bool) -> None:
        """Sample ``j`` into its row and through its pixel stage (``augment.samplework``)."""
        self.work.run(j, src, hwc)

    def _target(self, values: list, r: int) -> dict:
        hw = (int(self.heights[r]), int(self.widths[r]))
        return sample_target(self.dataset.fields, values[r], f"sample {self.indices[r]}", hw)

    def target(self, j: int, values: list) -> dict:
        """Sample ``j``'s target, its masks moved (a mosaic's from its four rows' masks); its boxes
        move after, the whole batch's at once."""
        draws, fields = self.draws, self.dataset.fields
        target = self._target(values, j)
        if not self.masks:
            return target
        rows = {name: buffer[j].numpy() for name, buffer in self.masks.items()}
        extra = draws.extra_rows(j)
        if extra:  # a mosaic: its masks' canvas from its four rows
            tiles = [target]
            for r in extra:
                tiles.append(self._target(values, r))
                self.targets[r] = tiles[-1]  # its boxes join the batch's, into this sample
            for name in rows:
                target[name] = draws.mask_canvas(j, [t[name] for t in tiles])
        return move_target(
            fields, target, draws.mask_map(j), draws.out_size, self.min_visibility, rows, False
        )
