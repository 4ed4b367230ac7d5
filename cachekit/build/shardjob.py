"""What one worker does: decode and preprocess a run of inputs, and commit them as one shard file.

A job is a small picklable value; it runs the same in this process, a local worker process or a
dask worker, and returns the shard's ``ShardInfo`` plus the inputs it had to skip.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BuildError
from ..image.ops import DecodeError, decode
from ..image.recipes import Pipeline
from ..store.encoding import encode_images
from ..store.formats import SHARD_NAME_COLUMN, get_format, identity_column
from ..store.location import open_location
from ..store.manifest import SampleSpec, ShardInfo, SkippedInput
from ..store.remote import filesystem, is_url
from .augment import AugmentConfig, VariantParams, colour_batch, crop_variant, variant_params

#: Augmented variants whose flip and colour jitter run together, as one batch.
_COLOUR_BATCH = 64

__all__ = [
    "ShardJob",
    "ShardResult",
    "run_shard_job",
    "read_input",
    "decode_input",
    "skip_reason",
    "INPUT_ERRORS",
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
    first_index: int = 0  # global index of paths[0] in the build's input order
    augment: AugmentConfig | None = None


@dataclass(frozen=True)
class ShardResult:
    index: int
    info: ShardInfo
    skipped: tuple[SkippedInput, ...]


def jpeg_truncated(data: bytes) -> bool:
    """True when a JPEG's last scan has no end-of-image marker after it (the file was cut short).

    libjpeg decodes such files "successfully" with the missing rows filled grey, so this is checked
    explicitly. An EXIF thumbnail's own end marker comes before the main scan and does not count.
    """
    return data.rfind(b"\xff\xd9") < data.rfind(b"\xff\xda")


def read_input(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _input_reader(root: str) -> Callable[[str], bytes]:
    """``rel -> bytes`` of the inputs under ``root``: a folder, or an fsspec URL."""
    if is_url(root):
        fs, base = filesystem(root)
        return lambda rel: fs.cat_file(f"{base}/{rel}")
    folder = Path(root)
    return lambda rel: read_input(folder / rel)


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, without decoding; None if not found."""
    i, n = 2, len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:
            i += 1
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return int.from_bytes(data[i + 5 : i + 7], "big"), int.from_bytes(data[i + 7 : i + 9], "big")
        i += 2 + length
    return None


def _reduce_for(data: bytes, pipeline: Pipeline) -> int:
    """The largest JPEG reduction (2, 4, 8) that keeps the image's short side >= the pipeline's sizes."""
    if pipeline.size is None or not data.startswith(b"\xff\xd8"):
        return 1
    hw = jpeg_size(data)
    if hw is None:
        return 1
    short, need = min(hw), _needed_short_side(pipeline)
    reduce = 1
    while reduce < 8 and short // (reduce * 2) >= need:
        reduce *= 2
    return reduce


def _needed_short_side(pipeline: Pipeline) -> int:
    return max(int(s.params.get("size", 0)) for s in pipeline.steps) if pipeline.steps else 0


def decode_input(data: bytes, pipeline: Pipeline, *, fast_decode: bool = False) -> np.ndarray:
    """Decode one raw input's bytes as a build does; DecodeError (saying why) for what a build skips.

    ``cachekit bench`` decodes its raw rows through this too, so both skip the same files.
    """
    if not data:
        raise DecodeError("empty file")
    if data.startswith(b"\xff\xd8") and jpeg_truncated(data):
        raise DecodeError("truncated JPEG (no end-of-image marker)")
    return decode(data, reduce=_reduce_for(data, pipeline) if fast_decode else 1)


#: What reading, decoding or preprocessing one input may raise: that input is skipped, not fatal.
INPUT_ERRORS: tuple[type[Exception], ...] = (DecodeError, OSError)


def skip_reason(exc: Exception) -> str:
    """The reason a build records for an input whose reading, decoding or preprocessing raised ``exc``."""
    if isinstance(exc, DecodeError):
        return str(exc)
    if isinstance(exc, OSError):
        return f"unreadable: {exc.strerror or exc}"
    return f"cannot be used: {exc}"


def _samples(
    job: ShardJob, index: int, img: np.ndarray
) -> list[tuple[np.ndarray, dict, VariantParams | None]]:
    """The stored samples of one decoded input: the recipe's output, or K augmented variants."""
    if job.augment is None:
        out, extras = job.pipeline.apply(img)
        return [(out, extras, None)]
    _, h, w = job.spec.shape
    orig = np.array(img.shape[:2], dtype=np.int32)
    found = []
    for v in range(job.augment.variants):
        p = variant_params(job.augment, index, v, img.shape[0], img.shape[1])
        extras = {"orig_size": orig, "source_index": np.int64(index), "variant": np.int32(v)}
        found.append((crop_variant(img, p, (h, w)), extras, p))
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
    pixel_sum = np.zeros(spec.shape[0], dtype=np.float64)
    pixel_sumsq = np.zeros(spec.shape[0], dtype=np.float64)
    pixel_count = 0
    skipped: list[SkippedInput] = []
    kept = 0
    pending: list[tuple[np.ndarray, dict, VariantParams | None, int]] = []  # variants awaiting colour ops

    def store(hwc: np.ndarray, sample_extras: dict, label: int) -> None:
        nonlocal kept, pixel_sum, pixel_sumsq, pixel_count
        if images is not None:
            images[kept] = hwc.transpose(2, 0, 1)
            chw = images[kept]
        else:
            chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
            ragged.append(chw)
        for name, value in sample_extras.items():
            extras[name][kept] = value
        labels[kept] = label
        flat = chw.reshape(spec.shape[0], -1).astype(np.float64)
        pixel_sum += flat.sum(axis=1)
        pixel_sumsq += np.einsum("ij,ij->i", flat, flat)
        pixel_count += flat.shape[1]
        kept += 1

    def flush() -> None:
        if pending:
            coloured = colour_batch(np.stack([s[0] for s in pending]), [s[2] for s in pending])
            for img, (_, sample_extras, _, label) in zip(coloured, pending):
                store(img, sample_extras, label)
            pending.clear()

    read = _input_reader(job.root)
    done = 0
    for offset, (rel, label) in enumerate(zip(job.paths, job.labels)):
        try:
            img = decode_input(read(rel), job.pipeline, fast_decode=job.fast_decode)
            samples = _samples(job, job.first_index + offset, img)
        except INPUT_ERRORS as exc:
            skipped.append(SkippedInput(rel, skip_reason(exc)))
        else:
            shape = samples[0][0].transpose(2, 0, 1).shape
            if not _fits(shape, spec.shape):
                skipped.append(
                    SkippedInput(rel, f"pipeline gave shape {list(shape)}, not {list(spec.shape)}")
                )
            elif job.augment is None:
                store(samples[0][0], samples[0][1], label)
            else:
                pending.extend((img, ex, p, label) for img, ex, p in samples)
                if len(pending) >= _COLOUR_BATCH:
                    flush()
        done += 1
        if progress is not None and done % 16 == 0:
            progress(16)
    flush()
    if progress is not None and done % 16:
        progress(done % 16)

    store = job.format_options.get("store", "pixels")
    if images is not None and store == "pixels":
        arrays = {"images": images[:kept], "labels": labels[:kept]}
    else:
        rows = ragged if images is None else images[:kept]
        data, offsets = encode_images(rows, store, job.format_options.get("quality", 90))
        arrays = {"image_bytes": data, "image_offsets": offsets, "labels": labels[:kept]}
        if images is None:
            arrays["image_shape"] = np.array([r.shape for r in rows], dtype=np.int32).reshape(-1, 3)
    arrays.update({name: value[:kept] for name, value in extras.items()})
    arrays[SHARD_NAME_COLUMN] = identity_column(job.file)  # what a reader checks the file against
    fmt = get_format(job.format)
    out = open_location(job.out)
    try:
        size, digest = out.commit(job.file, lambda tmp: fmt.write(tmp, arrays, job.format_options))
    except OSError as exc:
        reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise BuildError(f"cannot write shard {out.url}/{job.file}: {reason}") from None
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
