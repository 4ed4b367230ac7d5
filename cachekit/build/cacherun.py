"""One cache's build: plan its shards, reuse finished ones, run the shard jobs on an executor, check
them, write the manifest last.

Shard files are named by a hash of what they contain (``shardplan``), so a file that exists under its
planned name is the same shard: resume and ``--update`` reuse finished shards by name after
checking their size (and, for an interrupted build's, their checksum). Every shard is checked to
be at ``--out`` before the manifest is written, last; the shards it stops referencing are
retired, not deleted, so readers of the previous version finish their epoch (``retire``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import UTC, datetime
from functools import partial

import numpy as np

from ..constants import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_REMOTE_SHARD_BYTES,
    DEFAULT_SHARD_BYTES,
    MANIFEST_NAME,
    PARTIAL_DIR,
)
from ..cpus import available_cpus
from ..errors import BuildError
from ..store.location import Location, commit_index, write_failure
from ..store.manifest import Manifest, SampleSpec, ShardInfo
from ..store.manifestio import manifest_text
from ..store.remote import is_object_store, is_url, redact
from .config import BuildConfig, BuildResult
from .executors import run_jobs
from .findsource import Detected
from .guards import check_job_bytes, refuse
from .pool import WorkerCrashed
from .resume import Partial, existing_cache, read_partial, reusable, start_partial, write_sidecar
from .retire import collect, recorded_shards, remove_temps, remove_unrecorded_plan, retire
from .shardjob import ShardJob, ShardResult, run_shard_job
from .shardplan import PlannedShard, cache_fingerprint, layout, option_changes, plan
from .shardwrite import check_at_out, disk_full, remove_written
from .streamrun import job_options, stream_shards
from .strict import finished_refusal, skipped_inputs
from .target import Target, resolve_target

__all__ = ["build_cache", "run_cache"]

#: Annotations left out that the manifest lists by name (all are counted).
_DROPPED_LISTED = 1000


def build_cache(
    raw: str | os.PathLike,
    out: str | os.PathLike,
    config: BuildConfig,
    *,
    found=None,
    detected: Detected | None = None,
) -> BuildResult:
    """Build one cache of ``raw`` at ``out`` (``found``: RAW and its ``Source``, when the caller
    discovered them; ``detected``: RAW's layout, when the caller detected it), under ``out``'s lock."""
    started = time.perf_counter()
    target = resolve_target(raw, out, config, found=found, detected=detected)
    location = target.out
    location.mkdir()
    with location.lock():
        try:
            if getattr(
                target.source.reader, "stream", False
            ):  # an iterable: its shards are built as it is read
                target, config, streamed = stream_shards(target, config)
                return streamed.result(run_cache(target, config, started))
            return run_cache(target, config, started)
        except BaseException:
            with contextlib.suppress(Exception):  # never hide the error that stopped the build
                remove_temps(location)  # a killed worker's half-written shard; records stay for resume
            raise


def run_cache(t: Target, config: BuildConfig, started: float) -> BuildResult:
    """Plan ``t``'s shards, reuse what is built, run the rest, write the manifest; or say it is up to date."""
    out, source = t.out, t.source
    previous, text = existing_cache(out)
    partial = read_partial(out)
    order, shard_size = _cut(t, config, previous, partial)
    fingerprint = cache_fingerprint(t.content_fp, order, shard_size, source)
    seed = config.seed if (order["kind"] == "shuffled" or t.augment is not None) else None
    changes = option_changes(previous, t.content, order, shard_size, seed) if previous is not None else []
    refuse(out, t.raw, len(source), config, previous, text, changes, fingerprint, partial)
    grace = DEFAULT_GRACE_SECONDS if config.grace is None else config.grace
    referenced = _referenced(previous, text)
    if partial is None and out.names(PARTIAL_DIR):  # records whose plan is lost (killed while removed)
        remove_unrecorded_plan(out, (), referenced)
    if _up_to_date(out, previous, fingerprint):  # only clean what an interrupted run left
        if partial is not None:  # this run's, or an abandoned run's with other options: the cache
            remove_unrecorded_plan(out, partial.planned, referenced)  # in place is the one kept
        remove_temps(out)
        removed = collect(out, referenced, grace)
        return BuildResult(
            previous, out.url, "up to date", 0, 0, time.perf_counter() - started, removed=len(removed)
        )
    planned = plan(source, order, shard_size, t.content_fp, t.extension)
    remove_temps(out)
    finished = partial.finished if partial is not None else {}
    results, jobs = _reuse(t, config, planned, previous, finished)
    names = [s.name for s in planned]
    if partial is not None and partial.fingerprint != fingerprint:  # abandoned: drop what no plan needs
        remove_unrecorded_plan(out, partial.planned, referenced | set(names))
    start_partial(out, fingerprint, names, {"order": order, "shard_size": shard_size})
    for result in results.values():
        if result.info.file in finished:  # recorded again, so that a kill now loses none of them
            write_sidecar(out, result)
    reused = len(results)
    if reused and config.progress:
        print(f"reusing {reused} of {len(planned)} shards already built", file=sys.stderr)
    _run_jobs(t, config, jobs, results)
    ordered = [results[i] for i in range(len(planned))]
    shards, skipped = [r.info for r in ordered], skipped_inputs(source, ordered)
    refusal = finished_refusal(config.strict, skipped, source, shards, t.raw, out.url)
    if refusal is not None:
        remove_unrecorded_plan(out, names, referenced)
        raise refusal
    manifest, retired, removed = _commit(
        t, config, (order, shard_size, fingerprint), shards, skipped, referenced, names
    )
    status = _status(bool(finished and reused), previous is not None and not config.overwrite)
    elapsed = time.perf_counter() - started
    return BuildResult(manifest, out.url, status, len(jobs), reused, elapsed, retired - removed, removed)


def _status(resumed: bool, updated: bool) -> str:
    """What the build did: went on with an unfinished build, updated the cache in place, or built it."""
    if resumed:
        return "resumed"
    return "updated" if updated else "built"


def _up_to_date(out: Location, previous: Manifest | None, fingerprint: str) -> bool:
    """The cache in place was built from these inputs with these options, skipped no input it should
    retry, and has every shard it names."""
    return (
        previous is not None
        and previous.fingerprint == fingerprint
        and not any(s.retry for s in previous.skipped)
        and all(reusable(out, s, verify=False) for s in previous.shards)
    )


def _cut(
    t: Target, config: BuildConfig, previous: Manifest | None, partial: Partial | None
) -> tuple[dict, int]:
    """The order of the inputs and the shard size: asked for, else kept from the cache in place (or
    from an unfinished build), else chosen for the shard bytes ``--out`` wants."""
    requested = {
        "order": config.order,
        "seed": config.seed,
        "shard_size": config.shard_size,
        "shards": config.shards,
    }
    if getattr(t.source.reader, "sequential", False):  # files of records are read in their own order
        requested["order"] = "sorted"
    if config.overwrite:
        kept = None  # a fresh cut
    elif previous is not None:
        kept = {"order": previous.order, "shard_size": previous.format_options.get("shard_size")}
    else:
        kept = partial.layout if partial is not None else None
    target = DEFAULT_REMOTE_SHARD_BYTES if is_object_store(t.out.url) else DEFAULT_SHARD_BYTES
    per_input = t.spec.nbytes * (
        t.augment.variants if t.augment is not None else 1
    )  # a shard's rows are inputs
    order, shard_size = layout(t.source, per_input, requested, kept, target)
    check_job_bytes(shard_size, t.augment.variants if t.augment is not None else 1, t.spec.nbytes)
    return order, shard_size


def _reuse(
    t: Target, config: BuildConfig, planned: list[PlannedShard], previous: Manifest | None, finished: dict
) -> tuple[dict[int, ShardResult], list[ShardJob]]:
    """The planned shards already built (by an unfinished build, checked; or in the cache in place, by
    size) by index, and the jobs of the others. Shards are named by their content, so an unfinished
    build's finished shard is reusable whenever this build plans its name, even if that build had
    other inputs or options."""
    out, source = t.out, t.source
    old = {s.file: s for s in previous.shards} if previous is not None else {}
    retry = {s.path for s in previous.skipped if s.retry} if previous is not None else set()
    results: dict[int, ShardResult] = {}
    jobs = []
    for index, shard in enumerate(planned):
        paths = [source.paths[i] for i in shard.rows]
        done = finished.get(shard.name)
        if (
            done
            and done[0].inputs_digest == shard.digest
            and reusable(out, done[0], verify=not is_url(out.url))
        ):
            results[index] = ShardResult(index, done[0], done[1])
        elif (
            shard.name in old
            and old[shard.name].inputs_digest == shard.digest
            and retry.isdisjoint(paths)
            and reusable(out, old[shard.name], verify=False)
        ):
            results[index] = ShardResult(
                index, old[shard.name], tuple(s for s in previous.skipped if s.path in set(paths))
            )
        else:
            jobs.append(_job(t, config, index, shard, paths))
    return results, jobs


def _commit(
    t: Target, config: BuildConfig, cut: tuple, shards: list[ShardInfo], skipped, referenced: set, names: list
) -> tuple[Manifest, int, int]:
    """Check every shard is at ``--out``, write the index and the manifest (last), retire the shards it
    no longer names and collect those past their grace: the manifest, how many were retired and removed."""
    out = t.out
    order, shard_size, fingerprint = cut
    check_at_out(out, shards, config.executor)
    manifest = commit_index(out, _manifest(t, order, shard_size, fingerprint, shards, skipped))
    current = {s.file for s in shards} | {manifest.index["file"]}
    retired = retire(out, referenced, current)
    try:
        out.write_text(MANIFEST_NAME, manifest_text(manifest))
    except OSError as exc:
        raise BuildError(f"cannot write {out.url}/{MANIFEST_NAME}: {write_failure(exc)}") from None
    remove_unrecorded_plan(out, names, current)
    remove_temps(out)  # a worker lost mid-shard (dask re-ran its job elsewhere)
    removed = collect(out, current, DEFAULT_GRACE_SECONDS if config.grace is None else config.grace)
    return manifest, retired, len(removed)


def _job(t: Target, config: BuildConfig, index: int, shard: PlannedShard, paths: list[str]) -> ShardJob:
    return ShardJob(
        index=index,
        file=shard.name,
        paths=tuple(paths),
        labels=tuple(int(t.source.labels[i]) for i in shard.rows),
        inputs_digest=shard.digest,
        sizes=tuple(int(t.source.sizes[i]) for i in shard.rows)
        if config.executor == "dask" and t.source.reader is None
        else (),
        targets=tuple(t.source.targets[i] for i in shard.rows) if t.source.targets else (),
        masks_root=t.source.extra.get("masks"),
        array_roots=dict(t.source.extra.get("arrays", {})),
        reader=t.source.reader,
        **job_options(t, config),
    )


def _run_jobs(t: Target, config: BuildConfig, jobs: list[ShardJob], results: dict[int, ShardResult]) -> None:
    from tqdm import tqdm

    total = sum(len(j.paths) for j in jobs)
    with tqdm(
        total=total,
        unit="img",
        desc="build",
        disable=not config.progress or not jobs,
        dynamic_ncols=True,
        mininterval=0.5,
        file=sys.stderr,
    ) as bar:
        options = dict(config.executor_options)
        if config.executor == "dask":  # what a worker wrote where the client cannot see it goes too
            options["undo"] = partial(
                remove_written, t.out.url, [j.file for j in jobs], config.storage_options
            )
        try:
            running = run_jobs(
                run_shard_job,
                jobs,
                workers=config.workers or available_cpus(),
                executor=config.executor,
                on_progress=bar.update,
                **options,
            )
            with contextlib.closing(running):  # a failure here cancels the jobs and cleans up at once
                for _, result in running:
                    if config.executor == "dask":  # a shard the client cannot see: stop at the first
                        check_at_out(t.out, [result.info], config.executor)
                    results[result.index] = result
                    write_sidecar(t.out, result)
        except WorkerCrashed as exc:
            if disk_full(t.out):  # libhdf5 may crash rather than report a full disk
                shard = getattr(exc.job, "file", "a shard")
                raise BuildError(
                    f"cannot write shard {t.out.url}/{shard}: disk full (its worker process died, {exc.how})"
                ) from None
            raise


def _manifest(
    t: Target, order: dict, shard_size: int, fingerprint: str, shards: list[ShardInfo], skipped
) -> Manifest:
    mean, std = _stats(shards, t.spec)
    source = {
        "layout": t.source.layout,
        "inputs": len(t.source),
        "root": redact(t.raw) if isinstance(t.raw, str) else str(t.raw.resolve()),
    }
    if t.source.unread:
        source["unread"] = dict(t.source.unread)
    source.update({k: v for k, v in t.source.extra.items() if k not in ("masks", "arrays")})
    for name, folder in t.source.extra.get("arrays", {}).items():
        source.setdefault("arrays", {})[name] = redact(folder) if is_url(folder) else folder
    if t.source.extra.get("masks"):
        source["masks"] = (
            redact(t.source.extra["masks"]) if is_url(t.source.extra["masks"]) else t.source.extra["masks"]
        )
    if t.source.dropped:  # annotations left out: the first ones by name, and how many
        source["dropped"] = [{"where": w, "reason": r} for w, r in t.source.dropped[:_DROPPED_LISTED]]
        source["dropped_count"] = len(t.source.dropped)
    return Manifest(
        format=t.content.format,
        sample=t.spec,
        shards=tuple(shards),
        classes=t.source.classes,
        pipeline=t.content.pipeline,
        fingerprint=fingerprint,
        mean=mean,
        std=std,
        skipped=tuple(skipped),
        format_options={**t.content.options, "shard_size": shard_size},
        source=source,
        order=order,
        limits=t.content.limits,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def _referenced(previous: Manifest | None, text: str | None) -> set[str]:
    """The files the cache in ``--out`` references: its shards, and (format 5) its index."""
    if previous is None:
        return recorded_shards(text)
    return {s.file for s in previous.shards} | ({previous.index["file"]} if previous.index else set())


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
