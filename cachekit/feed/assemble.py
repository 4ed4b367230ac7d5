"""Reading a batch in the process that trains: threads over the batch write straight into a recycled buffer.

``make_loader``'s batch sampler hands the dataset a ``BatchRequest``: the indices plus the epoch,
the augmentation plan and a thread count, so a request reads the same batch wherever it runs (in
this process, or in a worker process it was pickled to). Each thread takes a contiguous slice of
the batch and, per sample, copies the memory-mapped row, decodes an encoded one, or crops,
resizes, flips and colours it with OpenCV (which releases the GIL) into its row of the output.
When the plan runs on the device instead, the batch is read as it is stored and its parameters
travel with it (``SampleBatch.aux``) to the loader's device stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..augment.batchwork import BatchWork
from ..augment.plan import Plan
from ..errors import CacheError
from ..image.ops import hwc_into_planes
from ..image.threads import use_one_opencv_thread
from ..store.encoding import decode_sample, read_raw
from ..store.fields import decode_mask
from .batch import SampleBatch
from .batchtargets import BatchTargets, read_fields, read_objects
from .buffers import BufferPool
from .chunks import run_chunks
from .rows import boxes_field
from .stages import clock, timed
from .timeouts import READ_TIMEOUT_SECONDS

__all__ = ["BatchRead", "BatchRequest", "run_chunks", "assemble"]


class BatchRequest(list):
    """The indices of one batch and how to read them (a list, so any Dataset sees plain indices)."""

    def __init__(
        self,
        indices=(),
        *,
        epoch: int = 0,
        seed: int = 0,
        plan: Plan | None = None,
        threads: int = 1,
        on_device: bool = False,
        channels_last: bool = False,
        timeout: float = READ_TIMEOUT_SECONDS,
        stages: str | None = None,
    ) -> None:
        super().__init__(indices)
        self.epoch, self.seed, self.plan = epoch, seed, plan
        self.threads, self.on_device = threads, on_device
        # augmented on threads: rows written channels-last where they can be
        self.channels_last = channels_last
        #: The longest the batch waits for its threads (the loader's ``timeout=``): ``ReadTimeout`` then.
        self.timeout = float(timeout)
        #: A profiled loader's ``StageLog`` folder: the batch's stages are timed there (``feed.stages``).
        self.stages = stages

    def __reduce__(self):
        options = dict(
            epoch=self.epoch, seed=self.seed, plan=self.plan, threads=self.threads, on_device=self.on_device,
            channels_last=self.channels_last, timeout=self.timeout, stages=self.stages,
        )  # fmt: skip
        return (_restore, (list(self), options))


def _restore(indices, options: dict) -> BatchRequest:
    return BatchRequest(indices, **options)


def _sizes(dataset, readers: list, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's stored height and width (variable-sized caches record them per sample)."""
    if not dataset.ragged:
        _, h, w = dataset.sample_shape
        return np.full(len(local), h, np.int64), np.full(len(local), w, np.int64)
    shapes = np.array([r.column("image_shape", slice(i, i + 1))[0] for r, i in zip(readers, local.tolist())])
    shapes = shapes.reshape(-1, 3)  # an empty batch too
    return shapes[:, 1].astype(np.int64), shapes[:, 2].astype(np.int64)


def _source(dataset, reader, i: int) -> tuple[np.ndarray, bool]:
    """Sample ``i`` of a shard as stored: (array, channels_last). Pixel rows are zero-copy views."""
    channels = dataset.sample_shape[0]
    if dataset.store == "pixels-hwc":
        pixels = read_raw(reader.column, i, "pixels-hwc", channels)
        if not dataset.ragged and (pixels.shape[2], *pixels.shape[:2]) != tuple(dataset.sample_shape):
            raise CacheError(
                f"a stored sample is {[pixels.shape[2], *pixels.shape[:2]]}, the manifest says "
                f"{list(dataset.sample_shape)}: the shard is damaged"
            )
        return pixels, True
    if dataset.store != "pixels":
        return decode_sample(reader.column, i, channels), True
    if dataset.ragged:
        return read_raw(reader.column, i, "pixels", channels), False
    array = reader.image_array
    return (array[i] if array is not None else reader.images(np.array([i]))[0]), False


def _decoded(stage_clock, source: Callable, r: int) -> tuple[np.ndarray, bool]:
    """``source(r)``, timed as the ``decode`` stage (an encoded store's sample)."""
    with stage_clock.stage("decode"):
        return source(r)


@dataclass
class BatchRead:
    """What a dataset hands ``assemble`` for one batch: row ``r`` of the read (the request's samples,
    then a mosaic's extra samples) is sample ``indices[r]``, row ``local[r]`` of ``readers[r]``,
    labelled ``labels[r]``;
    ``groups`` the read per shard (``(positions, column, rows, samples, memo)``, for its targets);
    ``buffers`` the dataset's pool of batch buffers; ``extra`` the mosaics' extra samples
    (``[n, 3]`` dataset indices, -1 where none) or None; ``stats()`` the cache's (mean, std)."""

    indices: list
    readers: list
    local: np.ndarray
    labels: np.ndarray
    groups: Callable[[], list]
    buffers: BufferPool
    extra: np.ndarray | None = None
    stats: Callable[[], tuple] | None = None


def assemble(dataset, request: BatchRequest, read: BatchRead) -> SampleBatch:
    """The batch ``request`` asks for, from ``read``: each sample copied, decoded or augmented into its
    row by the threads over the batch (its masks too), then finished as the plan's batch work says
    (``augment.batchwork``: its targets through the same maps, batch ops, mix, or the device's work).

    The targets' boxes and points are read and moved for the whole batch at once, in this thread,
    never beside the threads copying pixels (box arithmetic holds the GIL: measured, a thread of
    its own for it slowed the pixel threads more than it saved)."""
    n = len(request)
    stage_clock = clock(request.stages)
    heights, widths = _sizes(dataset, read.readers, read.local)
    fields = getattr(dataset, "fields", None) or {}
    targets = stored = None
    if fields:
        with timed(stage_clock, "targets"):
            targets, stored = _read_targets(dataset, fields, read, n)
    work = _draw(dataset, request, read, heights, widths, targets)
    out = _rows(dataset, request, work, read.buffers, n, heights, widths)
    masks = _mask_rows(fields, read.buffers, n, work.out_size if work is not None else tuple(out.shape[-2:]), work is None)
    run = _sample_work(dataset, read, work, out, masks, stored, heights, widths, stage_clock)
    run_chunks(n, request.threads, run, request.timeout)
    batch = _finish(dataset, request, read, work, out, masks, targets, heights, widths, stage_clock)
    if stage_clock is not None:
        stage_clock.flush()
    return batch


def _read_targets(dataset, fields: dict, read: BatchRead, n: int) -> tuple[BatchTargets, list]:
    """A batch's targets as read (every row's objects, a mosaic's extra rows' too; the samples' other
    fields), and every row's masks as stored (PNG bytes, decoded by the threads)."""
    groups, classes, shape = read.groups(), len(dataset.classes), dataset.sample_shape
    others = [kind for kind in {spec.kind for spec in fields.values()} if kind not in ("boxes", "keypoints", "mask")]
    targets = BatchTargets(
        fields, read_objects(fields, groups, classes, shape), others=read_fields(fields, others, groups, n, classes, shape)
    )
    return targets, read_fields(fields, ("mask",), groups, len(read.local), classes, shape)


def _draw(dataset, request: BatchRequest, read: BatchRead, heights, widths, targets) -> BatchWork | None:
    """The plan's batch work (None without a plan): its draws from the stored sizes, a mosaic's extra
    samples' and (an IoU crop) each sample's boxes as read."""
    plan, n = request.plan, len(request)
    if not plan:
        return None
    boxes = None
    if plan.needs_boxes:
        objects = targets.objects[boxes_field(dataset)]
        boxes = [np.asarray(objects.boxes[a:b]).reshape(-1, 4) for a, b in objects.spans(n)]
    extra_hw = None
    if read.extra is not None:
        extra_hw = np.zeros((n, 3, 2), np.int64)
        extra_hw[read.extra[:, 0] >= 0] = np.stack([heights[n:], widths[n:]], axis=1).reshape(-1, 3, 2)
    work = plan.draw_batch(
        request.seed, request.epoch, np.asarray(request, dtype=np.int64), heights[:n], widths[:n],
        extra=read.extra, extra_hw=extra_hw, boxes=boxes, on_device=request.on_device,
        channels_last=request.channels_last, stats=read.stats, detection=targets is not None and bool(targets.objects),
    )  # fmt: skip
    channels = dataset.sample_shape[0]
    if work.draws.jitter is not None and channels != 3:
        raise CacheError(f"ColorJitter needs RGB samples; this cache stores {channels} channel(s)")
    return work


def _rows(dataset, request: BatchRequest, work: BatchWork | None, buffers, n: int, heights, widths) -> np.ndarray:
    """The batch's output buffer ``[n, C, H, W]``: augmented rows (channels-last underneath where the
    work writes them so), or each sample as stored, padded with zeros to the largest (the device's
    pixel sources, a mosaic's canvas window; samples of their own sizes): padding is never data."""
    channels = dataset.sample_shape[0]
    if work is not None and not work.on_device:
        if work.rows_last(channels):  # [n, C, H, W] seen over an [n, H, W, C] block: a crop resized straight in
            # (the tensor keeps the pooled block's handle alive; a numpy view of it alone would not)
            return torch.from_numpy(buffers.get((n, *work.out_size, channels))).permute(0, 3, 1, 2).numpy()
        return buffers.get((n, channels, *work.out_size))
    sources = work.source_size(dataset.ragged) if work is not None else None
    if sources is None and not dataset.ragged:
        return buffers.get((n, *dataset.sample_shape))
    if sources is None:
        sources = int(heights.max(initial=0)), int(widths.max(initial=0))
    out = buffers.get((n, channels, *sources))
    out.fill(0)
    return out


def _mask_rows(fields: dict, buffers, n: int, hw: tuple[int, int], zeroed: bool) -> dict[str, torch.Tensor]:
    """A ``[n, H, W]`` buffer per mask field; ``zeroed`` where a mask may be smaller than its row (as
    stored, padded like the images), else each row is written whole.

    Tensors, with rows taken as ``buffer[j].numpy()``: each row keeps the pooled block in use (a
    numpy view of a numpy view names only the block as its base, and the pool would reuse it)."""
    masks = {name: torch.from_numpy(buffers.get((n, *hw))) for name, spec in fields.items() if spec.kind == "mask"}
    if zeroed:
        for buffer in masks.values():
            buffer.zero_()
    return masks


def _sample_work(dataset, read: BatchRead, work, out, masks, stored, heights, widths, stage_clock) -> Callable:
    """What a thread over the batch does to samples ``lo``..``hi``: pixels, then masks (``stored``:
    each row's as stored); each sample's stages timed on ``stage_clock`` (a profiled loader's)."""
    local = read.local.tolist()
    source = lambda r: _source(dataset, read.readers[r], local[r])  # noqa: E731
    if stage_clock is not None and dataset.store not in ("pixels", "pixels-hwc"):
        unclocked = source
        source = lambda r: _decoded(stage_clock, unclocked, r)  # noqa: E731
    pixels = work.sample_work(out, heights, widths, source) if work is not None else None
    pixel_stage = "read" if work is None or work.on_device else "augment"  # the device augments its own

    def mask(r: int, name: str) -> np.ndarray:
        return decode_mask(stored[r][name], f"sample {read.indices[r]}", (int(heights[r]), int(widths[r])))

    def run(lo: int, hi: int) -> None:
        for j in range(lo, hi):
            src, hwc = source(j)
            if pixels is not None:
                with timed(stage_clock, pixel_stage):
                    pixels.run(j, src, hwc)  # its geometry, colour and (threads) pixel stage
            else:
                with timed(stage_clock, "read"):
                    if hwc:
                        hwc_into_planes(src, out[j, :, : heights[j], : widths[j]])
                    else:
                        out[j, :, : heights[j], : widths[j]] = src
            if masks:
                with timed(stage_clock, "masks"):
                    _masks_of(j)

    def _masks_of(j: int) -> None:
        for name, buffer in masks.items():
            row = buffer[j].numpy()
            if work is None:
                found = mask(j, name)
                row[: found.shape[0], : found.shape[1]] = found
            else:
                work.mask(j, [mask(r, name) for r in (j, *work.extra_rows(j))], row)

    if work is not None and not work.on_device or dataset.store != "pixels" or masks:
        use_one_opencv_thread()  # the threads over the batch are the parallelism
    return run


def _finish(dataset, request, read: BatchRead, work, out, masks, targets, heights, widths, stage_clock) -> SampleBatch:
    """The batch after its threads: its targets through the work's maps and mix, its rows through the
    batch ops and mix (threads path) or its device work (device path), its labels."""
    n = len(request)
    labels = read.labels[:n]
    aux = None
    if targets is not None:
        targets.masks = masks
        hw = [tuple(work.out_size)] * n if work is not None else list(zip(heights[:n].tolist(), widths[:n].tolist()))
        targets.image_hw = hw
        if work is not None:
            with timed(stage_clock, "targets"):
                targets.objects = work.mix_targets(work.move(targets.objects, n), masks, n)
    if work is not None:
        mix = request.plan.mix
        num_classes = (mix.num_classes or len(dataset.classes)) if mix is not None else None
        labels = work.labels(labels, num_classes)
        if work.on_device:
            aux = work.device_work(heights[:n], widths[:n])
        else:
            with timed(stage_clock, "batch_ops"):
                out = work.finish_rows(out, lambda: read.buffers.get(out.shape),
                                       lambda size, fn: run_chunks(size, request.threads, fn, request.timeout))  # fmt: skip
    elif dataset.ragged:
        aux = {"sizes": torch.from_numpy(np.stack([heights, widths], axis=1))}
    return SampleBatch(torch.from_numpy(out), torch.from_numpy(labels), aux, targets)
