"""What one worker does: read, decode and preprocess a run of inputs, and commit them as one shard.

A job is a small picklable value; it runs the same in a local worker process or a dask worker,
and returns the shard's ``ShardInfo`` plus the inputs it had to skip. No input can stop a build:
whatever goes wrong with one (bad bytes, a bomb, an OpenCV error, running out of memory on it) is
a skip with its reason. Only writing the shard can fail the job.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..constants import DEFAULT_MAX_PIXELS
from ..errors import BuildError
from ..image.geometry import DEFAULT_MIN_VISIBILITY, Affine
from ..image.ops import DecodeError
from ..image.recipes import Pipeline
from ..store.encoding import encode_images, shaped_store
from ..store.formats import SHARD_NAME_COLUMN, identity_column
from ..store.manifest import SampleSpec, ShardInfo, SkippedInput
from ..store.remote import redact
from ..store.sourcecol import pack_sources
from .headers import jpeg_size
from .inputorder import input_key
from .inputs import INPUT_ERRORS, decode_input, jpeg_truncated, max_input_bytes, skip_reason
from .offline_variants import AugmentConfig, colour_batch, crop_variant, rotation, variant_params
from .sampletargets import move_values, move_values_matrix, raw_values
from .shardwrite import commit_shard, disk_full
from .sources.annotate import ARRAY_FILE_MAX_BYTES
from .sources.reading import input_reader, read_input, read_retrying
from .sources.records import ReaderFailures, Record

#: Augmented variants whose flip and colour jitter run together, as one batch.
_COLOUR_BATCH = 64

__all__ = [
    "ShardJob",
    "ShardResult",
    "InputUnreadable",
    "run_shard_job",
    "commit_shard",
    "disk_full",
    "read_input",
    "decode_input",
    "skip_reason",
    "INPUT_ERRORS",
    "max_input_bytes",
    "jpeg_truncated",
    "jpeg_size",
]


@dataclass(frozen=True)
class ShardJob:
    """Build the shard ``file`` from ``paths`` (relative to ``root``), in this order."""

    index: int
    file: str
    root: str
    out: str
    paths: tuple[str, ...]
    labels: tuple[int, ...]
    inputs_digest: str
    pipeline: Pipeline
    spec: SampleSpec
    format: str
    format_options: dict
    fast_decode: bool = False
    augment: AugmentConfig | None = None
    max_pixels: int = DEFAULT_MAX_PIXELS  # 0: no limit
    #: An input that cannot be read fails the job instead of being skipped (dask: another worker
    #: may see it; a skip would hide a folder some workers do not mount).
    unreadable_fails: bool = False
    #: Each input's size when RAW was listed (with ``unreadable_fails``): a worker that reads
    #: other bytes sees another RAW than the client did, and fails instead of caching them.
    sizes: tuple[int, ...] = ()
    #: How to reach ``root`` and ``out`` when they are URLs: plain data, so that each worker process
    #: makes its own filesystem; never shown (``repr``) nor written anywhere.
    storage_options: dict = field(default_factory=dict, repr=False)
    #: Each input's raw target (``Source.targets``), when the samples have fields besides the image.
    targets: tuple = ()
    #: The folder (or URL) of the inputs' mask files, when the samples have a ``mask`` field.
    masks_root: str | None = None
    #: Each array field's folder (or URL) of ``.npy`` files.
    array_roots: dict = field(default_factory=dict)
    #: Boxes keeping less of their area than this through the recipe or a variant's crop are dropped.
    min_visibility: float = DEFAULT_MIN_VISIBILITY
    #: How inputs that are not files under ``root`` are read (rows of Parquet files, members of tars,
    #: samples of a Python dataset): ``reader.open(storage_options, max_bytes)`` gives
    #: ``read(rel, target) -> bytes | Record`` (``records``); None: files.
    reader: object | None = None


@dataclass(frozen=True)
class ShardResult:
    index: int
    info: ShardInfo
    skipped: tuple[SkippedInput, ...]


class InputUnreadable(BuildError):
    """An input could not be read by a job that must not skip it (``ShardJob.unreadable_fails``)."""


def _samples(job: ShardJob, rel: str, img: np.ndarray, values: dict) -> list[tuple]:
    """The stored samples of one decoded input, each ``(image, extras, variant, field values)``:
    the recipe's output, or K augmented variants; the fields go through each one's geometry."""
    fields = job.spec.fields
    if job.augment is None:
        out, extras = job.pipeline.apply(img)
        affine, _ = job.pipeline.geometry(*img.shape[:2])
        return [(out, extras, None, move_values(fields, values, affine, out.shape[:2], job.min_visibility))]
    _, h, w = job.spec.shape
    orig = np.array(img.shape[:2], dtype=np.int32)
    key = input_key(rel)
    found = []
    for v in range(job.augment.variants):
        p = variant_params(job.augment, key, v, img.shape[0], img.shape[1])
        extras = {"orig_size": orig, "input_key": np.int64(key), "variant": np.int32(v)}
        moved = values
        if fields:
            then = Affine.crop(p.top, p.left, p.height, p.width, (h, w))
            if p.flip:  # the pixels are flipped with the colour ops, later; their fields here
                then = then.then(Affine.hflip(w))
            if p.angle:
                moved = move_values_matrix(
                    fields, values, rotation(p), then, (h, w), job.min_visibility, img.shape[:2]
                )
            else:
                moved = move_values(fields, values, then, (h, w), job.min_visibility)
        found.append((crop_variant(img, p, (h, w)), extras, p, moved))
    return found


def _fits(shape: tuple[int, ...], spec_shape: tuple[int | None, ...]) -> bool:
    """A sample's ``[C, H, W]`` matches the spec; ``None`` (ragged) matches any size."""
    return len(shape) == len(spec_shape) and all(s is None or s == d for s, d in zip(spec_shape, shape))


def run_shard_job(job: ShardJob, progress: Callable[[int], None] | None = None) -> ShardResult:
    """Decode, preprocess and write one shard; bad inputs are skipped and reported, not fatal."""
    spec = job.spec
    n = len(job.paths)
    per_input = job.augment.variants if job.augment else 1
    # fixed-size samples go straight into one array; ragged ones are kept one by one
    images = None if spec.ragged else np.empty((n * per_input, *spec.shape), dtype=np.uint8)
    ragged: list[np.ndarray] = []
    extras = {name: np.zeros((n * per_input, *a.shape), dtype=a.dtype) for name, a in spec.extras.items()}
    labels = np.empty(n * per_input, dtype=np.int64)
    sources: list[str] = []
    pixel_sum = np.zeros(spec.shape[0], dtype=np.float64)
    pixel_sumsq = np.zeros(spec.shape[0], dtype=np.float64)
    pixel_count = 0
    skipped: list[SkippedInput] = []
    kept = 0
    pending: list[tuple] = []  # (image, extras, variant, field values, label, path) awaiting colour ops
    values: dict[str, list] = {name: [] for name in spec.fields}  # each kept sample's, per field

    def store(hwc: np.ndarray, sample_extras: dict, sample_values: dict, label: int, rel: str) -> None:
        nonlocal kept, pixel_sum, pixel_sumsq, pixel_count
        if images is not None:
            images[kept] = hwc.transpose(2, 0, 1)
            chw = images[kept]
        else:
            chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
            ragged.append(chw)
        for name, value in sample_extras.items():
            extras[name][kept] = value
        for name in values:
            values[name].append(sample_values.get(name))
        labels[kept] = label
        sources.append(rel)
        flat = chw.reshape(spec.shape[0], -1).astype(np.float64)
        pixel_sum += flat.sum(axis=1)
        pixel_sumsq += np.einsum("ij,ij->i", flat, flat)
        pixel_count += flat.shape[1]
        kept += 1

    def flush() -> None:
        if pending:
            coloured = colour_batch(np.stack([s[0] for s in pending]), [s[2] for s in pending])
            for img, (_, sample_extras, _, sample_values, label, rel) in zip(coloured, pending):
                store(img, sample_extras, sample_values, label, rel)
            pending.clear()

    if job.reader is not None:
        read_record = job.reader.open(job.storage_options, max_input_bytes(job.max_pixels))
        failures = ReaderFailures()
    else:
        read_file = input_reader(job.root, max_input_bytes(job.max_pixels), job.storage_options)
    read_mask = (
        input_reader(job.masks_root, max_input_bytes(job.max_pixels), job.storage_options)
        if job.masks_root
        else None
    )
    read_array = {
        name: input_reader(root, ARRAY_FILE_MAX_BYTES, job.storage_options)
        for name, root in job.array_roots.items()
    }
    done = 0
    for k, (rel, label) in enumerate(zip(job.paths, job.labels)):
        target = job.targets[k] if job.targets else None
        try:
            if job.reader is not None:
                data = failures.read(read_record, rel, target)
                if isinstance(data, Record):
                    data, target, label = data.image, data.target, data.label
            else:
                data = read_retrying(read_file, rel)
            if job.unreadable_fails and job.sizes and len(data) != job.sizes[k]:
                raise InputUnreadable(
                    f"{job.root}/{rel} on {socket.gethostname()} holds {len(data)} bytes, the client listed "
                    f"{job.sizes[k]}: RAW must be one storage that every worker sees the same, at the same path"
                )
        except DecodeError as exc:
            skipped.append(SkippedInput(rel, str(exc)))
            data = None
        except OSError as exc:
            reason = skip_reason(exc)
            if job.unreadable_fails:
                raise InputUnreadable(
                    f"cannot read {job.root}/{rel} on {socket.gethostname()} ({reason}): RAW must be storage "
                    "that every worker sees at the same path, or a URL"
                ) from None
            skipped.append(SkippedInput(rel, reason, retry=True))
            data = None
        if data is not None:
            try:
                img = decode_input(
                    data,
                    job.pipeline,
                    fast_decode=job.fast_decode,
                    max_pixels=job.max_pixels,
                    check_recipe=job.augment is None,  # augmented variants crop first, then resize
                )
                raw = (
                    raw_values(spec.fields, target, img.shape[:2], read_mask, read_array)
                    if spec.fields
                    else {}
                )
                samples = _samples(job, rel, img, raw)
                shape = samples[0][0].transpose(2, 0, 1).shape
            except Exception as exc:  # any failure on one input is a skip, never an abort
                skipped.append(SkippedInput(rel, skip_reason(exc)))
            else:
                if not _fits(shape, spec.shape):
                    skipped.append(
                        SkippedInput(rel, f"pipeline gave shape {list(shape)}, not {list(spec.shape)}")
                    )
                elif job.augment is None:
                    store(samples[0][0], samples[0][1], samples[0][3], label, rel)
                else:
                    pending.extend((img, ex, p, moved, label, rel) for img, ex, p, moved in samples)
                    if len(pending) >= _COLOUR_BATCH:
                        flush()
            del data
        done += 1
        if progress is not None and done % 16 == 0:
            progress(16)
    flush()
    if progress is not None:  # also the last word before the shard is written: a cancelled job stops here
        progress(done % 16)

    store_kind = job.format_options.get("store", "pixels")
    if images is not None and store_kind == "pixels":
        arrays = {"images": images[:kept], "labels": labels[:kept]}
    else:
        rows = ragged if images is None else images[:kept]
        data, offsets = encode_images(rows, store_kind, job.format_options.get("quality", 90))
        arrays = {"image_bytes": data, "image_offsets": offsets, "labels": labels[:kept]}
        if images is None or shaped_store(store_kind):
            arrays["image_shape"] = np.array([r.shape for r in rows], dtype=np.int32).reshape(-1, 3)
    arrays.update({name: value[:kept] for name, value in extras.items()})
    for name, field_spec in spec.fields.items():
        arrays.update(field_spec.handler.pack(name, field_spec.params, values[name]))
    arrays.update(pack_sources(sources))
    arrays[SHARD_NAME_COLUMN] = identity_column(job.file)  # what a reader checks the file against
    size, digest = commit_shard(
        job.out, job.file, job.format, arrays, job.format_options, job.storage_options
    )
    if job.storage_options:  # a filesystem's message is recorded in the manifest: never a secret in it
        skipped = [SkippedInput(s.path, redact(s.reason, job.storage_options), s.retry) for s in skipped]
    info = ShardInfo(
        file=job.file,
        samples=kept,
        bytes=size,
        sha256=digest,
        inputs=n,
        first=job.paths[0],
        last=job.paths[-1],
        inputs_digest=job.inputs_digest,
        pixel_sum=tuple(float(v) for v in pixel_sum),
        pixel_sumsq=tuple(float(v) for v in pixel_sumsq),
        pixel_count=pixel_count,
    )
    return ShardResult(job.index, info, tuple(skipped))
