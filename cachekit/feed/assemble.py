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

import numpy as np
import torch

from ..augment.plan import Plan
from ..errors import CacheError
from ..image.ops import hwc_into_planes
from ..image.threads import use_one_opencv_thread
from ..store.encoding import decode_sample, read_raw
from .batch import SampleBatch
from .chunks import run_chunks
from .rows import Rows, draw_batch, read_indices
from .targets import box_keys, move_boxes_of_batch, sample_target, stage_targets
from .timeouts import READ_TIMEOUT_SECONDS

__all__ = ["BatchRequest", "run_chunks", "assemble"]


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
    ) -> None:
        super().__init__(indices)
        self.epoch, self.seed, self.plan = epoch, seed, plan
        self.threads, self.on_device = threads, on_device
        # augmented on threads: rows written channels-last where they can be
        self.channels_last = channels_last
        #: The longest the batch waits for its threads (the loader's ``timeout=``): ``ReadTimeout`` then.
        self.timeout = float(timeout)

    def __reduce__(self):
        options = (self.epoch, self.seed, self.plan, self.threads, self.on_device, self.channels_last, self.timeout)
        return (_restore, (list(self), *options))


def _restore(
    indices, epoch, seed, plan, threads, on_device, channels_last=False, timeout=READ_TIMEOUT_SECONDS
) -> BatchRequest:
    return BatchRequest(
        indices,
        epoch=epoch,
        seed=seed,
        plan=plan,
        threads=threads,
        on_device=on_device,
        channels_last=channels_last,
        timeout=timeout,
    )


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


def _channels_last_rows(request: BatchRequest, draws, stage, channels: int) -> bool:
    """Whether the batch is written channels-last as it is augmented (``make_loader(channels_last=
    True)``): crops, resizes and flips write any layout; the warps, colour jitter, the pixel stage
    and mixing work on planes, and such a batch is converted once at the end instead."""
    return (
        request.channels_last
        and channels in (3, 4)
        and stage is None
        and request.plan.mix is None
        and draws.any_layout
    )


def _stage_draws(dataset, request: BatchRequest, draws):
    """The batch's per-sample stage draws (RandAugment, erasing, ...), or None when its plan has none."""
    stage = request.plan.stage if draws is not None else None
    if stage is None:
        return None
    stats = None
    if stage.needs_stats:  # erasing with noise: the statistics normalize=True uses
        manifest = getattr(dataset, "manifest", None)
        stats = getattr(dataset, "normalization", None) or (manifest.mean, manifest.std)
    return stage.draw(request.seed, request.epoch, np.asarray(request, dtype=np.int64), draws.out_size, stats)


def _point_pairs(dataset) -> list[tuple[str, str, list | None]]:
    """Each keypoints field: its boxes' key, its own name, its ``flip_idx``."""
    fields = getattr(dataset, "fields", {})
    return [
        (box_keys(spec.params["boxes"])[0], name, spec.params.get("flip_idx"))
        for name, spec in fields.items()
        if spec.kind == "keypoints"
    ]


def _mix_batch(dataset, request: BatchRequest, draws, out, labels, targets, masks, keys, on_threads: bool):
    """MixUp / CutMix over a batch (``augment.mixing``): soft labels on a classification cache, both
    samples' boxes on a detection cache (``keys``: its boxes fields' keys); on the threads the mixed
    rows go into a second buffer, each from two rows of the first. Returns ``(draws, images, labels)``."""
    plan = request.plan
    mix = plan.mix.draw(request.seed, request.epoch, request, draws.out_size, detection=bool(keys))
    if keys:
        mix.mix_targets(targets, keys + [(kp,) for _, kp, _ in _point_pairs(dataset)], masks)
    else:
        labels = mix.soft_labels(labels, plan.mix.num_classes or len(dataset.classes))
    if on_threads and mix.mixes:
        mixed = dataset._buffers.get(out.shape)
        run_chunks(
            len(out),
            request.threads,
            lambda lo, hi: [mix.mix_row(out, mixed, j) for j in range(lo, hi)],
            request.timeout,
        )
        out = mixed
    return mix, out, labels


def _mask_buffers(dataset, n: int, hw: tuple[int, int] | None) -> dict[str, torch.Tensor]:
    """A ``[n, H, W]`` buffer per mask field, when every mask of the batch has one size ``hw``.

    Tensors, with rows taken as ``buffer[j].numpy()``: each row keeps the pooled block in use (a
    numpy view of a numpy view names only the block as its base, and the pool would reuse it).
    """
    if hw is None:
        return {}
    return {
        name: torch.from_numpy(dataset._buffers.get((n, *hw)))
        for name, spec in dataset.fields.items()
        if spec.kind == "mask"
    }


def assemble(
    dataset,
    request: BatchRequest,
    readers: list,
    local: np.ndarray,
    labels: np.ndarray,
    values: Callable[[], list] | None = None,
) -> SampleBatch:
    """Read (and, on threads, augment) the samples at ``readers[j]``, row ``local[j]``, into one batch.

    ``values``: what reads each sample's stored field values (``targets.read_values``), for caches
    with fields. Masks are decoded and moved with their pixels, in the same threads. The targets of
    a cache without masks are read and moved for the whole batch at once after its pixels
    (``CachedDataset.batch_targets``): box arithmetic holds the GIL, so it is kept to a few array
    operations a batch, never run beside the threads copying pixels (measured: a thread of its own
    for it slowed the pixel threads more than it saved).

    With a ``Mosaic``, the rows past the request's own are its extra samples (``rows.read_indices``):
    each mosaic's canvas is assembled from its four rows, and their boxes and masks go into it.
    """
    n = len(request)  # rows past n: the mosaics' extra samples
    channels = dataset.sample_shape[0]
    heights, widths = _sizes(dataset, readers, local)
    plan = request.plan
    whole = values is not None and not any(f.kind == "mask" for f in dataset.fields.values())
    values = None if whole or values is None else values()  # without masks: all at once, after the pixels
    indices = read_indices(request, dataset) if plan is not None and plan.mosaic else list(request)
    draws, early = draw_batch(dataset, request, readers, local, heights, widths, values, whole)
    if draws is not None and draws.jitter is not None and channels != 3:
        raise CacheError(f"ColorJitter needs RGB samples; this cache stores {channels} channel(s)")
    sources = draws.source_size(dataset.ragged) if draws is not None else None
    stage = _stage_draws(dataset, request, draws)
    on_threads = draws is not None and not request.on_device
    if on_threads and _channels_last_rows(request, draws, stage, channels):
        # [n, C, H, W] seen over an [n, H, W, C] block: a crop is resized straight into its row
        # (the tensor keeps the pooled block's handle alive; a numpy view of it alone would not)
        out = (
            torch.from_numpy(dataset._buffers.get((n, *draws.out_size, channels))).permute(0, 3, 1, 2).numpy()
        )
    elif on_threads:
        out = dataset._buffers.get((n, channels, *draws.out_size))
    elif sources is not None:  # each pixel source (a mosaic's canvas window), padded to the largest
        out = dataset._buffers.get((n, channels, *sources))
        out.fill(0)
    elif dataset.ragged:  # padded to the largest, with zeros: padding is never sampled as data
        out = dataset._buffers.get((n, channels, int(heights.max(initial=0)), int(widths.max(initial=0))))
        out.fill(0)
    else:
        out = dataset._buffers.get((n, *dataset.sample_shape))
    local_list = local.tolist()
    targets: list = [None] * len(local) if values is not None else []
    if values is None:
        masks = {}
    elif draws is not None:
        masks = _mask_buffers(dataset, n, draws.out_size)
    else:  # as stored: padded like the images when their sizes differ
        masks = _mask_buffers(dataset, n, tuple(out.shape[-2:]))
        for buffer in masks.values():
            buffer.zero_()
    visibility = plan.min_visibility if plan is not None else 0.0
    rows = None
    if draws is not None:
        source = lambda r: _source(dataset, readers[r], local_list[r])  # noqa: E731
        rows = Rows(
            dataset, draws, out, on_threads, heights, widths, source, masks, targets, indices, visibility, stage
        )

    def work(lo: int, hi: int) -> None:
        for j in range(lo, hi):
            src, hwc = _source(dataset, readers[j], local_list[j])
            if rows is not None:
                rows.pixels(j, src, hwc)  # its geometry, colour and (threads) pixel stage
                if values is not None:
                    targets[j] = rows.target(j, values)
                    if stage is not None:  # RandAugment's shears, translations, rotations
                        for buffer in masks.values():
                            stage.move_mask(buffer[j].numpy(), j)
                continue
            dst = out[j, :, : heights[j], : widths[j]]
            if hwc:
                hwc_into_planes(src, dst)
            else:
                dst[...] = src
            if values is not None:
                hw = (int(heights[j]), int(widths[j]))
                target = sample_target(dataset.fields, values[j], f"sample {indices[j]}", hw)
                for name, buffer in masks.items():
                    mask = target[name]
                    if mask.shape != (heights[j], widths[j]):
                        raise CacheError(f"a stored mask is {mask.shape}, its image {heights[j]}x{widths[j]}")
                    row = buffer[j].numpy()
                    row[: mask.shape[0], : mask.shape[1]] = mask
                    target[name] = row[: mask.shape[0], : mask.shape[1]]
                targets[j] = target

    if on_threads or dataset.store != "pixels" or values is not None:
        use_one_opencv_thread()  # the threads over the batch are the parallelism
    run_chunks(n, request.threads, work, request.timeout)
    if whole and early is not None:  # read before the draws (an IoU crop's): moved now
        targets = early
        move_boxes_of_batch(dataset.fields, targets, draws, visibility)
    elif whole:
        targets = dataset.batch_targets(indices, readers, local, draws, visibility)
    elif values is not None and draws is not None:
        move_boxes_of_batch(dataset.fields, targets, draws, visibility)
    targets = targets[:n]
    labels = labels[:n]
    keys = (
        [box_keys(name) for name, spec in getattr(dataset, "fields", {}).items() if spec.kind == "boxes"]
        if draws is not None
        else []
    )
    if stage is not None and (values is not None or whole) and keys:
        stage_targets(dataset.fields, targets, stage, visibility)
    mix = None
    ops = plan.draw_batch_ops(request.seed, request.epoch, request) if draws is not None else None
    if ops is not None and on_threads:  # the user's BatchOps listed before MixUp / CutMix
        ops.apply_rows(out, after=False)
    if draws is not None and plan.mix is not None:
        mix, out, labels = _mix_batch(dataset, request, draws, out, labels, targets, masks, keys, on_threads)
    if ops is not None and on_threads:
        ops.apply_rows(out, after=True)
    aux = None
    if draws is not None and request.on_device:
        mixes = mix if mix is not None and mix.mixes else None
        aux = draws.device_work(heights[:n], widths[:n], stage=stage, batch_ops=ops, mix=mixes)
    elif draws is None and dataset.ragged:
        aux = {"sizes": torch.from_numpy(np.stack([heights, widths], axis=1))}
    batch = SampleBatch(torch.from_numpy(out), torch.from_numpy(labels), aux)
    if values is not None or whole:
        batch.targets, batch.masks = targets, masks
        batch.fields = dataset.fields
        batch.image_hw = (
            [tuple(draws.out_size)] * n if draws is not None else list(zip(heights.tolist(), widths.tolist()))
        )
    return batch
