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
from .sampletargets import move_values, raw_values, rotated_then
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
        return [(out, extras, None, move_values(fields, values, [(affine, out.shape[:2], job.min_visibility)]))]
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
                steps = rotated_then(rotation(p), img.shape[:2], then, (h, w), job.min_visibility)
            else:
                steps = [(then, (h, w), job.min_visibility)]
            moved = move_values(fields, values, steps)
        found.append((crop_variant(img, p, (h, w)), extras, p, moved))
    return found


def _fits(shape: tuple[int, ...], spec_shape: tuple[int | None, ...]) -> bool:
    """A sample's ``[C, H, W]`` matches the spec; ``None`` (ragged) matches any size."""
    return len(shape) == len(spec_shape) and all(s is None or s == d for s, d in zip(spec_shape, shape))


class _Rows:
    """The rows of one shard as they are kept: the pixels (one array, or one by one when ragged), the
    extras, classes, source paths and field values, and the pixel statistics. Augmented variants
    wait in ``pending`` for their flip and colour jitter, run ``_COLOUR_BATCH`` at a time."""

    def __init__(self, spec: SampleSpec, rows: int) -> None:
        self.spec = spec
        # fixed-size samples go straight into one array; ragged ones are kept one by one
        self.images = None if spec.ragged else np.empty((rows, *spec.shape), dtype=np.uint8)
        self.ragged: list[np.ndarray] = []
        self.extras = {name: np.zeros((rows, *a.shape), dtype=a.dtype) for name, a in spec.extras.items()}
        self.labels = np.empty(rows, dtype=np.int64)
        self.sources: list[str] = []
        self.pixel_sum = np.zeros(spec.shape[0], dtype=np.float64)
        self.pixel_sumsq = np.zeros(spec.shape[0], dtype=np.float64)
        self.pixel_count = 0
        self.kept = 0
        self.pending: list[tuple] = []  # (image, extras, variant, field values, label, path)
        self.values: dict[str, list] = {name: [] for name in spec.fields}  # each kept sample's, per field

    def store(self, hwc: np.ndarray, sample_extras: dict, sample_values: dict, label: int, rel: str) -> None:
        """Keep one sample (HWC pixels) with its extras, field values, class and source path."""
        kept = self.kept
        if self.images is not None:
            self.images[kept] = hwc.transpose(2, 0, 1)
            chw = self.images[kept]
        else:
            chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
            self.ragged.append(chw)
        for name, value in sample_extras.items():
            self.extras[name][kept] = value
        for name in self.values:
            self.values[name].append(sample_values.get(name))
        self.labels[kept] = label
        self.sources.append(rel)
        flat = chw.reshape(self.spec.shape[0], -1).astype(np.float64)
        self.pixel_sum += flat.sum(axis=1)
        self.pixel_sumsq += np.einsum("ij,ij->i", flat, flat)
        self.pixel_count += flat.shape[1]
        self.kept += 1

    def add_variants(self, samples: list[tuple], label: int, rel: str) -> None:
        """Queue one input's augmented variants for their colour ops (a batch run when enough wait)."""
        self.pending.extend((img, ex, p, moved, label, rel) for img, ex, p, moved in samples)
        if len(self.pending) >= _COLOUR_BATCH:
            self.flush()

    def flush(self) -> None:
        """Run the colour ops of the variants waiting, and keep them."""
        if self.pending:
            coloured = colour_batch(np.stack([s[0] for s in self.pending]), [s[2] for s in self.pending])
            for img, (_, sample_extras, _, sample_values, label, rel) in zip(coloured, self.pending):
                self.store(img, sample_extras, sample_values, label, rel)
            self.pending.clear()

    def arrays(self, job: ShardJob) -> dict[str, np.ndarray]:
        """The shard's columns: pixels (or encoded images), classes, extras, fields, sources, its name."""
        kept, spec = self.kept, self.spec
        store_kind = job.format_options.get("store", "pixels")
        if self.images is not None and store_kind == "pixels":
            arrays = {"images": self.images[:kept], "labels": self.labels[:kept]}
        else:
            rows = self.ragged if self.images is None else self.images[:kept]
            data, offsets = encode_images(rows, store_kind, job.format_options.get("quality", 90))
            arrays = {"image_bytes": data, "image_offsets": offsets, "labels": self.labels[:kept]}
            if self.images is None or shaped_store(store_kind):
                arrays["image_shape"] = np.array([r.shape for r in rows], dtype=np.int32).reshape(-1, 3)
        arrays.update({name: value[:kept] for name, value in self.extras.items()})
        for name, field_spec in spec.fields.items():
            arrays.update(field_spec.handler.pack(name, field_spec.params, self.values[name]))
        arrays.update(pack_sources(self.sources))
        arrays[SHARD_NAME_COLUMN] = identity_column(job.file)  # what a reader checks the file against
        return arrays


class _Inputs:
    """One job's reads: its reader's records (rows of files, samples of a dataset) or the files under
    its root, and the mask and array files beside them."""

    def __init__(self, job: ShardJob) -> None:
        self.job = job
        if job.reader is not None:
            self.read_record = job.reader.open(job.storage_options, max_input_bytes(job.max_pixels))
            self.failures = ReaderFailures()
        else:
            self.read_file = input_reader(job.root, max_input_bytes(job.max_pixels), job.storage_options)
        self.read_mask = (
            input_reader(job.masks_root, max_input_bytes(job.max_pixels), job.storage_options)
            if job.masks_root
            else None
        )
        self.read_array = {
            name: input_reader(root, ARRAY_FILE_MAX_BYTES, job.storage_options)
            for name, root in job.array_roots.items()
        }

    def read(self, k: int, rel: str, label: int, skipped: list[SkippedInput]) -> tuple:
        """Input ``k``'s ``(data, target, label)`` (a record's own target and class), data None when
        it was skipped (the reason added to ``skipped``); a job that must not skip raises."""
        job = self.job
        target = job.targets[k] if job.targets else None
        try:
            if job.reader is not None:
                data = self.failures.read(self.read_record, rel, target)
                if isinstance(data, Record):
                    data, target, label = data.image, data.target, data.label
            else:
                data = read_retrying(self.read_file, rel)
            if job.unreadable_fails and job.sizes and len(data) != job.sizes[k]:
                raise InputUnreadable(
                    f"{job.root}/{rel} on {socket.gethostname()} holds {len(data)} bytes, the client listed "
                    f"{job.sizes[k]}: RAW must be one storage that every worker sees the same, at the same path"
                )
        except DecodeError as exc:
            skipped.append(SkippedInput(rel, str(exc)))
            return None, target, label
        except OSError as exc:
            reason = skip_reason(exc)
            if job.unreadable_fails:
                raise InputUnreadable(
                    f"cannot read {job.root}/{rel} on {socket.gethostname()} ({reason}): RAW must be storage "
                    "that every worker sees at the same path, or a URL"
                ) from None
            skipped.append(SkippedInput(rel, reason, retry=True))
            return None, target, label
        return data, target, label


def _take(
    job: ShardJob, rows: _Rows, inputs: _Inputs, rel: str, data, target, label: int, skipped: list
) -> None:
    """Decode one input and keep its samples, or skip it with the reason (any failure is a skip)."""
    spec = job.spec
    try:
        img = decode_input(
            data,
            job.pipeline,
            fast_decode=job.fast_decode,
            max_pixels=job.max_pixels,
            check_recipe=job.augment is None,  # augmented variants crop first, then resize
        )
        read_mask, read_array = inputs.read_mask, inputs.read_array
        raw = raw_values(spec.fields, target, img.shape[:2], read_mask, read_array) if spec.fields else {}
        samples = _samples(job, rel, img, raw)
        shape = samples[0][0].transpose(2, 0, 1).shape
    except Exception as exc:  # any failure on one input is a skip, never an abort
        skipped.append(SkippedInput(rel, skip_reason(exc)))
        return
    if not _fits(shape, spec.shape):
        skipped.append(SkippedInput(rel, f"pipeline gave shape {list(shape)}, not {list(spec.shape)}"))
    elif job.augment is None:
        rows.store(samples[0][0], samples[0][1], samples[0][3], label, rel)
    else:
        rows.add_variants(samples, label, rel)


def run_shard_job(job: ShardJob, progress: Callable[[int], None] | None = None) -> ShardResult:
    """Decode, preprocess and write one shard; bad inputs are skipped and reported, not fatal."""
    rows = _Rows(job.spec, len(job.paths) * (job.augment.variants if job.augment else 1))
    inputs = _Inputs(job)
    skipped: list[SkippedInput] = []
    done = 0
    for k, (rel, label) in enumerate(zip(job.paths, job.labels)):
        data, target, label = inputs.read(k, rel, label, skipped)
        if data is not None:
            _take(job, rows, inputs, rel, data, target, label, skipped)
        del data
        done += 1
        if progress is not None and done % 16 == 0:
            progress(16)
    rows.flush()
    if progress is not None:  # also the last word before the shard is written: a cancelled job stops here
        progress(done % 16)
    return _commit(job, rows, skipped)


def _commit(job: ShardJob, rows: _Rows, skipped: list[SkippedInput]) -> ShardResult:
    """Write the shard's file and say what it holds (its skips' reasons without a secret in them)."""
    size, digest = commit_shard(
        job.out, job.file, job.format, rows.arrays(job), job.format_options, job.storage_options
    )
    if job.storage_options:  # a filesystem's message is recorded in the manifest: never a secret in it
        skipped = [SkippedInput(s.path, redact(s.reason, job.storage_options), s.retry) for s in skipped]
    info = ShardInfo(
        file=job.file,
        samples=rows.kept,
        bytes=size,
        sha256=digest,
        inputs=len(job.paths),
        first=job.paths[0],
        last=job.paths[-1],
        inputs_digest=job.inputs_digest,
        pixel_sum=tuple(float(v) for v in rows.pixel_sum),
        pixel_sumsq=tuple(float(v) for v in rows.pixel_sumsq),
        pixel_count=rows.pixel_count,
    )
    return ShardResult(job.index, info, tuple(skipped))
