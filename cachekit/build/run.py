"""Build orchestration: plan shards, run shard jobs on an executor, resume, write the manifest last.

Shard files are named by a hash of what they contain (the options that shape the pixels, and the
inputs they cover), so a file that exists under its planned name is the same shard: resume, update
and rebuild all reuse finished shards by name after checking their size and checksum.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ..constants import (
    DEFAULT_FORMAT,
    DEFAULT_PIPELINE,
    DEFAULT_SHARD_BYTES,
    MANIFEST_NAME,
    MAX_SHARD_SAMPLES,
    MIN_SHARD_SAMPLES,
    PARTIAL_DIR,
)
from ..cpus import available_cpus
from ..errors import BuildError, UsageError
from ..image.recipes import Pipeline, load_pipeline
from ..store.encoding import check_store
from ..store.formats import get_format
from ..store.location import Location, open_location
from ..store.manifest import ArraySpec, Manifest, SampleSpec, ShardInfo, SkippedInput, manifest_text
from ..store.remote import is_url
from .augment import AUGMENT_EXTRAS, AugmentConfig
from .executors import run_jobs
from .resume import check_out, existing_cache, read_sidecars, remove_unreferenced, reusable, write_sidecar
from .shardjob import ShardJob, ShardResult, run_shard_job
from .sources import Source, discover, path_key

__all__ = ["BuildConfig", "BuildResult", "build", "default_shard_size", "probe_shape"]

#: Small datasets get at least this many shards so every worker has work to balance.
_MIN_SHARDS = 16


@dataclass(frozen=True)
class BuildConfig:
    """Options of one build; ``None`` means "choose a sensible default"."""

    format: str = DEFAULT_FORMAT
    pipeline: str = DEFAULT_PIPELINE
    size: int | None = None
    workers: int | None = None
    shard_size: int | None = None
    labels: str | Path | None = None
    strict: bool = False
    overwrite: bool = False
    update: bool = False
    fast_decode: bool = False
    augment: int = 0  # variants per input; 0 = no augmentation
    seed: int = 0
    augment_rotate: float = 0.0
    compression: str = "none"
    store: str = "pixels"  # or "jpeg" / "png": samples kept encoded, decoded on read
    quality: int = 90  # --store jpeg
    executor: str = "local"
    executor_options: dict = field(default_factory=dict)
    progress: bool = True


@dataclass(frozen=True)
class BuildResult:
    manifest: Manifest
    path: str  # the cache folder or URL
    status: str  # "built" | "up to date" | "updated" | "resumed"
    built_shards: int
    reused_shards: int
    seconds: float

    @property
    def skipped(self) -> int:
        return len(self.manifest.skipped)

    def summary(self) -> str:
        m = self.manifest
        rate = m.num_samples / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.status}: {m.num_samples} samples, {self.skipped} skipped, {len(m.shards)} shards "
            f"({self.reused_shards} reused), {m.total_bytes / 1e6:.1f} MB, {self.seconds:.1f} s "
            f"({rate:.0f} samples/s) -> {self.path}"
        )


def probe_shape(pipeline: Pipeline) -> tuple[int, int | None, int | None]:
    """The stored sample shape ``[3, H, W]``, found by running the recipe on two unlike images.

    A recipe whose output size follows its input's (no final crop or letterbox) gives ragged
    samples: ``[3, None, None]``, each stored at its own size.
    """
    shapes = set()
    for h, w in ((97, 131), (413, 288)):
        out, _ = pipeline.apply(np.zeros((h, w, 3), dtype=np.uint8))
        shapes.add(out.shape)
    if len(shapes) != 1:
        return (3, None, None)
    h, w, c = shapes.pop()
    return (c, h, w)


def default_shard_size(sample_bytes: int, inputs: int) -> int:
    """About DEFAULT_SHARD_BYTES of pixels per shard, fewer for small datasets so work spreads out."""
    by_bytes = max(MIN_SHARD_SAMPLES, DEFAULT_SHARD_BYTES // max(1, sample_bytes))
    balanced = max(MIN_SHARD_SAMPLES, math.ceil(inputs / _MIN_SHARDS))
    return min(by_bytes, balanced, MAX_SHARD_SAMPLES)


def _sha(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _plan(
    source: Source, shard_size: int, keep: tuple[ShardInfo, ...], positional: bool = False
) -> list[tuple[int, int, ShardInfo | None]]:
    """Split the inputs into shard ranges ``[start, stop)``.

    Ranges of ``keep`` (the previous cache's shards) whose inputs are unchanged stay as they are;
    the inputs between them are chunked afresh. With nothing to keep this is plain chunking.
    ``positional``: a shard's content also depends on its inputs' indices (augmentation seeds),
    so it is kept only where its inputs did not move.
    """
    keys = [path_key(p) for p in source.paths]
    kept: list[tuple[int, int, ShardInfo]] = []
    pos = old_start = 0
    for info in keep:
        lo = bisect.bisect_left(keys, path_key(info.first), lo=pos)
        hi = bisect.bisect_right(keys, path_key(info.last), lo=lo)
        unchanged = hi - lo == info.inputs and hi > lo and source.digest(lo, hi) == info.inputs_digest
        if unchanged and (not positional or lo == old_start):
            kept.append((lo, hi, info))
            pos = hi
        old_start += info.inputs
    plan: list[tuple[int, int, ShardInfo | None]] = []
    start = 0
    for lo, hi, info in [*kept, (len(source), len(source), None)]:
        for a in range(start, lo, shard_size):
            plan.append((a, min(a + shard_size, lo), None))
        if info is not None:
            plan.append((lo, hi, info))
        start = hi
    return plan


def _stats(shards: list[ShardInfo], spec: SampleSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    count = sum(s.pixel_count for s in shards)
    if count == 0:
        zeros = tuple(0.0 for _ in range(spec.shape[0]))
        return zeros, zeros
    total = np.sum([s.pixel_sum for s in shards], axis=0)
    total_sq = np.sum([s.pixel_sumsq for s in shards], axis=0)
    mean = total / count
    std = np.sqrt(np.maximum(total_sq / count - mean**2, 0.0))
    return tuple(round(float(v) / 255.0, 8) for v in mean), tuple(round(float(v) / 255.0, 8) for v in std)


def build(raw: str | Path, out: str | Path, config: BuildConfig = BuildConfig()) -> BuildResult:
    """Decode and preprocess every input under ``raw`` into a sharded cache at ``out``."""
    started = time.perf_counter()
    raw = str(raw) if is_url(raw) else Path(raw)
    out = open_location(out)
    source = discover(raw, config.labels)
    pipeline = load_pipeline(config.pipeline, config.size)
    fmt = get_format(config.format)
    check_store(config.store, config.quality)
    options = {"compression": config.compression, "store": config.store}
    if config.store == "jpeg":
        options["quality"] = config.quality
    fmt.check_options(options)
    augment = (
        AugmentConfig(config.augment, config.seed, rotate=config.augment_rotate) if config.augment else None
    )
    extras = {name: ArraySpec(shape, dtype) for name, (shape, dtype) in pipeline.extras.items()}
    if augment is not None:
        if set(extras) != {"orig_size"}:
            raise UsageError(
                f"--augment crops and rotates images, so it cannot keep {pipeline.name!r}'s per-sample "
                f"geometry ({', '.join(sorted(set(extras) - {'orig_size'}))}); use a classification recipe"
            )
        extras.update(AUGMENT_EXTRAS)
    spec = SampleSpec(shape=probe_shape(pipeline), extras=extras)
    if augment is not None and spec.ragged:
        raise UsageError(
            f"--augment needs a recipe with a fixed output size; {pipeline.name!r} keeps each image's"
        )
    if config.shard_size is not None and not 1 <= config.shard_size <= MAX_SHARD_SAMPLES:
        raise UsageError(f"--shard-size must be between 1 and {MAX_SHARD_SAMPLES}")
    if config.workers is not None and config.workers < 1:
        raise UsageError("--workers must be at least 1")

    pipeline_json = pipeline.to_json() | {"fast_decode": config.fast_decode}
    if augment is not None:
        pipeline_json["augment"] = augment.to_json()
    content = {
        "pipeline": pipeline_json,
        "format": fmt.name,
        "options": options,
        "sample": spec.to_json(),
        "classes": list(source.classes),
    }
    content_fp = _sha(content)
    fingerprint = hashlib.sha256(f"{content_fp}\n{source.digest()}".encode()).hexdigest()

    previous = existing_cache(out) if out.exists() else None
    if (
        previous is not None
        and previous.fingerprint == fingerprint
        and config.shard_size in (None, previous.format_options.get("shard_size"))
        and all(reusable(out, s, verify=False) for s in previous.shards)
    ):
        return BuildResult(previous, out.url, "up to date", 0, 0, time.perf_counter() - started)

    if config.shard_size is not None:
        shard_size = config.shard_size
    elif (
        config.update and previous is not None and isinstance(previous.format_options.get("shard_size"), int)
    ):
        shard_size = previous.format_options["shard_size"]
    else:
        shard_size = default_shard_size(spec.nbytes, len(source))
    sidecars = read_sidecars(out, fingerprint)
    check_out(out, config, previous, resumable=sidecars is not None)
    sidecars = sidecars or {}
    out.mkdir()

    target = _Target(
        raw,
        out,
        source,
        pipeline,
        spec,
        fmt.name,
        options,
        shard_size,
        content_fp,
        fingerprint,
        pipeline_json,
        augment,
    )
    with out.lock():
        return _run(target, config, previous, sidecars, started)


@dataclass(frozen=True)
class _Target:
    """What a build writes, resolved from its inputs and options: everything ``_run`` needs to know."""

    raw: Path | str
    out: Location
    source: Source
    pipeline: Pipeline
    spec: SampleSpec
    fmt_name: str
    options: dict
    shard_size: int
    content_fp: str
    fingerprint: str
    pipeline_json: dict
    augment: AugmentConfig | None


def _run(
    target: _Target,
    config: BuildConfig,
    previous: Manifest | None,
    sidecars: dict[str, tuple[ShardInfo, tuple[SkippedInput, ...]]],
    started: float,
) -> BuildResult:
    t = target
    out, source = t.out, t.source
    keep = previous.shards if (config.update and previous is not None) else ()
    plan = _plan(source, t.shard_size, keep, positional=t.augment is not None)
    old = {s.file: s for s in previous.shards} if previous is not None else {}
    results: dict[int, ShardResult] = {}
    jobs: list[ShardJob] = []
    ext = get_format(t.fmt_name).extension
    for index, (start, stop, kept) in enumerate(plan):
        digest = source.digest(start, stop)
        position = f":{start}" if t.augment else ""  # augmented content depends on input indices
        name = f"shard-{hashlib.sha256(f'{t.content_fp}{digest}{position}'.encode()).hexdigest()[:20]}{ext}"
        if kept is not None and reusable(out, kept, verify=False):
            results[index] = ShardResult(index, kept, _skipped_in(previous, source, start, stop))
            continue
        done = sidecars.get(name)
        if done and done[0].inputs_digest == digest and reusable(out, done[0], verify=True):
            results[index] = ShardResult(index, done[0], done[1])
            continue
        if name in old and old[name].inputs_digest == digest and reusable(out, old[name], verify=True):
            results[index] = ShardResult(index, old[name], _skipped_in(previous, source, start, stop))
            continue
        jobs.append(
            ShardJob(
                index=index,
                file=name,
                root=str(t.raw),
                out=out.url,
                paths=source.paths[start:stop],
                labels=tuple(int(v) for v in source.labels[start:stop]),
                inputs_digest=digest,
                pipeline=t.pipeline,
                spec=t.spec,
                format=t.fmt_name,
                format_options=t.options,
                fast_decode=config.fast_decode,
                first_index=start,
                augment=t.augment,
            )
        )
    reused = len(results)
    try:
        out.mkdir(PARTIAL_DIR)
        out.write_text(f"{PARTIAL_DIR}/state.json", json.dumps({"fingerprint": t.fingerprint}))
    except OSError as exc:
        raise BuildError(f"cannot write to {out.url}: {exc.strerror}") from None
    workers = config.workers or available_cpus()
    total = sum(len(j.paths) for j in jobs)
    if reused and config.progress:
        print(f"reusing {reused} of {len(plan)} shards already built", file=sys.stderr)
    from tqdm import tqdm

    with tqdm(
        total=total,
        unit="img",
        desc="build",
        disable=not config.progress or not jobs,
        dynamic_ncols=True,
        mininterval=0.5,
        file=sys.stderr,
    ) as bar:
        for _, result in run_jobs(
            run_shard_job,
            jobs,
            workers=workers,
            executor=config.executor,
            on_progress=bar.update,
            **config.executor_options,
        ):
            results[result.index] = result
            try:
                write_sidecar(out, result)
            except OSError as exc:
                raise BuildError(f"cannot write to {out.url}: {exc.strerror}") from None

    shards = [results[i].info for i in range(len(plan))]
    skipped = [SkippedInput(p, r) for p, r in source.ignored]
    for i in range(len(plan)):
        skipped.extend(results[i].skipped)
    if config.strict and skipped:
        listed = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:20])
        more = f" (and {len(skipped) - 20} more)" if len(skipped) > 20 else ""
        remove_unreferenced(out, previous)
        raise BuildError(f"--strict: {len(skipped)} inputs could not be used: {listed}{more}")
    if sum(s.samples for s in shards) == 0:
        raise UsageError(f"{t.raw}: none of the {len(source)} inputs could be decoded")
    mean, std = _stats(shards, t.spec)
    manifest = Manifest(
        format=t.fmt_name,
        sample=t.spec,
        shards=tuple(shards),
        classes=source.classes,
        pipeline=t.pipeline_json,
        fingerprint=t.fingerprint,
        mean=mean,
        std=std,
        skipped=tuple(skipped),
        format_options={**t.options, "shard_size": t.shard_size},
        source={
            "layout": source.layout,
            "inputs": len(source),
            "root": t.raw if isinstance(t.raw, str) else str(t.raw.resolve()),
        },
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    try:
        out.write_text(MANIFEST_NAME, manifest_text(manifest))
    except OSError as exc:
        raise BuildError(f"cannot write {out.url}/{MANIFEST_NAME}: {exc.strerror}") from None
    remove_unreferenced(out, manifest)
    if config.update and previous is not None:
        status = "updated"
    elif sidecars and reused:
        status = "resumed"
    else:
        status = "built"
    return BuildResult(manifest, out.url, status, len(jobs), reused, time.perf_counter() - started)


def _skipped_in(previous: Manifest | None, source: Source, start: int, stop: int) -> tuple[SkippedInput, ...]:
    """The previous cache's skip entries for inputs in ``[start, stop)`` (a reused shard's own)."""
    if previous is None:
        return ()
    wanted = set(source.paths[start:stop])
    return tuple(s for s in previous.skipped if s.path in wanted)
