"""Building from a stream (an iterable without ``__len__``): read once, in order, cut into runs of the
shard size as it comes, each run a shard job sent to the workers with its samples, a worker's worth
at a time (memory: the shards in flight).

Each run's shard is named as a plan of the whole stream would name it (positions, the stream's
identity, the build's options), and recorded in the build's records before it is written, so a
killed build reads the stream again, skips the runs whose shards are finished, and ends with the
same bytes. Once the stream ends its length is known, and the usual build (``run``) plans the same
shards, finds them all finished and writes the manifest.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from ..constants import DEFAULT_REMOTE_SHARD_BYTES, DEFAULT_SHARD_BYTES, MAX_SHARD_SAMPLES, MIN_SHARD_SAMPLES
from ..cpus import available_cpus
from ..errors import UsageError
from ..store.remote import is_object_store
from .config import BuildConfig, BuildResult
from .executors import run_jobs
from .guards import check_job_bytes, refuse
from .resume import existing_cache, read_partial, reusable, start_partial, write_sidecar
from .shardjob import ShardJob, run_shard_job
from .shardplan import option_changes, plan
from .shardwrite import remove_written
from .sources.inputtable import Source
from .sources.iterable import ChunkReader, positions, samples_digest

__all__ = ["stream_shards", "Streamed", "job_options"]


@dataclass(frozen=True)
class Streamed:
    """What reading the stream did: shards built, and shards found already there."""

    built: int
    reused: int

    def result(self, found: BuildResult) -> BuildResult:
        """The build's result as the stream's: built and reused as they were while it was read."""
        if found.status == "up to date" and not self.built:
            return found
        status = "resumed" if self.reused and found.status != "updated" else found.status
        if not self.reused and found.status == "resumed":
            status = "built"
        return replace(found, status=status, built_shards=self.built, reused_shards=self.reused)


def _shard_size(t, config: BuildConfig, previous, partial_) -> int:
    if config.shard_size is not None:
        return config.shard_size
    if previous is not None and not config.overwrite and previous.order.get("kind") == "sorted":
        size = previous.format_options.get("shard_size")
        if isinstance(size, int) and 1 <= size <= MAX_SHARD_SAMPLES:
            return size
    if partial_ is not None and isinstance((partial_.layout or {}).get("shard_size"), int):
        return partial_.layout["shard_size"]
    target = DEFAULT_REMOTE_SHARD_BYTES if is_object_store(t.out.url) else DEFAULT_SHARD_BYTES
    per_input = t.spec.nbytes * (t.augment.variants if t.augment is not None else 1)
    return max(MIN_SHARD_SAMPLES, min(target // max(1, per_input), MAX_SHARD_SAMPLES))


def job_options(t, config: BuildConfig) -> dict:
    """What every shard job of a build shares, whatever its inputs: where it reads and writes, the
    recipe, the stored form, the checks (``t``: the build's resolved target, ``target.Target``)."""
    return {
        "root": str(t.raw),
        "out": t.out.url,
        "pipeline": t.pipeline,
        "spec": t.spec,
        "format": t.content.format,
        "format_options": t.content.options,
        "fast_decode": config.fast_decode,
        "augment": t.augment,
        "max_pixels": config.max_pixels,
        "unreadable_fails": config.executor == "dask",
        "storage_options": config.storage_options,
        "min_visibility": config.min_visibility,
    }


def _job(t, config: BuildConfig, index: int, name: str, digest: str, start: int, records: tuple) -> ShardJob:
    return ShardJob(
        index=index,
        file=name,
        paths=positions(start, len(records)),
        labels=tuple(-1 for _ in records),
        inputs_digest=digest,
        reader=ChunkReader(start, records),
        **job_options(t, config),
    )


def _chunk(source: Source, start: int, count: int) -> Source:
    """The stream's positions ``start`` .. ``start + count`` as a source (to name their shard)."""
    return replace(
        source,
        paths=positions(start, count),
        labels=np.full(count, -1, dtype=np.int64),
        sizes=np.zeros(count, dtype=np.int64),
        mtimes=np.zeros(count, dtype=np.int64),
    )


def stream_shards(t, config: BuildConfig):
    """Read the stream of ``t.source`` and build its shards; returns the target with the whole
    source (its length now known), the options that plan the same shards, and a ``Streamed``."""
    out, source = t.out, t.source
    previous, text = existing_cache(out)
    found = read_partial(out)
    size = _shard_size(t, config, previous, found)
    check_job_bytes(size, t.augment.variants if t.augment is not None else 1, t.spec.nbytes)
    order = {"kind": "sorted"}
    fingerprint = hashlib.sha256(f"stream\n{t.content_fp}\n{size}\n{source.identity}".encode()).hexdigest()
    if previous is not None:
        changes = option_changes(previous, t.content, order, size, None)
        if changes and not config.overwrite:
            raise UsageError(
                f"--out {out.url} holds a cache built with other options ({', '.join(changes)}); "
                "pass --overwrite to rebuild it"
            )
    else:
        # an unfinished build of this stream (or another) goes on, as --update does for a folder
        refuse(
            out,
            t.raw,
            0,
            replace(config, update=config.update or found is not None),
            None,
            text,
            [],
            fingerprint,
            found,
        )
    finished = found.finished if found is not None else {}
    old = {s.file: s for s in previous.shards} if previous is not None and not config.overwrite else {}
    planned = list(found.planned) if found is not None else []
    layout = {"order": order, "shard_size": size}
    workers = config.workers or available_cpus()
    records = source.reader.records()
    built = reused = count = 0
    wave: list[ShardJob] = []
    digests: dict[str, str] = {}  # each shard's samples, recorded with it
    recorded = found.samples if found is not None else {}
    kept = previous.source.get("samples") if old else None  # the cache's shards' samples, when recorded
    kept = kept if isinstance(kept, dict) else {}

    def run_wave() -> None:
        nonlocal built
        if not wave:
            return
        start_partial(out, fingerprint, planned, layout)  # each name recorded before its shard is written
        options = dict(config.executor_options)
        if config.executor == "dask":
            options["undo"] = partial(remove_written, out.url, [j.file for j in wave], config.storage_options)
        for _, result in run_jobs(run_shard_job, wave, workers=workers, executor=config.executor, **options):
            write_sidecar(out, result, digests.get(result.info.file))
            built += 1
        wave.clear()

    for index in itertools.count():
        chunk = tuple(itertools.islice(records, size))
        if not chunk:
            break
        start, count = count, count + len(chunk)
        shard = plan(_chunk(source, start, len(chunk)), order, size, t.content_fp, t.extension)[0]
        if shard.name not in planned:
            planned.append(shard.name)
        digests[shard.name] = digest = samples_digest(chunk)
        # what the shard finished before (or the cache's) holds; None: not known
        mine = recorded.get(shard.name) if shard.name in finished else kept.get(shard.name)
        if (
            (shard.name in finished or shard.name in old)
            and mine not in (None, digest)
            and not config.overwrite
        ):
            raise UsageError(
                f"the iterable gave other samples than the build it resumes in {out.url} (samples {start} "
                f"to {count - 1}): an iterable must repeat its order to resume; rebuild with --overwrite"
            )
        done = finished.get(shard.name) if mine == digest else None
        done = done or ((old[shard.name], ()) if shard.name in old and mine in (None, digest) else None)
        if done and done[0].inputs_digest == shard.digest and reusable(out, done[0], verify=False):
            reused += 1
            continue
        wave.append(_job(t, config, index, shard.name, shard.digest, start, chunk))
        if len(wave) >= workers:
            run_wave()
    run_wave()
    if not count:
        raise UsageError("the iterable yields no samples: nothing to build")
    start_partial(out, fingerprint, planned, layout)
    whole = replace(_chunk(source, 0, count), extra={**source.extra, "samples": digests})  # in the manifest
    config = replace(config, shard_size=size, update=config.update or previous is None, order="sorted")
    return replace(t, source=whole), config, Streamed(built, reused)
