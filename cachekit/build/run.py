"""Build orchestration: plan shards, run shard jobs on an executor, resume, write the manifest last.

Shard files are named by a hash of what they contain (``shardplan``), so a file that exists under its
planned name is the same shard: resume and ``--update`` reuse finished shards by name after
checking their size (and, for an interrupted build's, their checksum). Every shard is checked to
be at ``--out`` before the manifest is written, last; the shards it stops referencing are
retired, not deleted, so readers of the previous version finish their epoch (``retire``).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import sys
import time
import warnings
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import numpy as np

from ..constants import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_REMOTE_SHARD_BYTES,
    DEFAULT_SHARD_BYTES,
    MANIFEST_NAME,
    PARTIAL_DIR,
)
from ..cpus import available_cpus
from ..errors import BuildError, CacheError, UsageError
from ..image.recipes import Pipeline, load_pipeline
from ..store.encoding import check_store
from ..store.formats import get_format
from ..store.location import Location, commit_index, open_location, write_failure
from ..store.manifest import ArraySpec, Manifest, SampleSpec, ShardInfo, SkippedInput
from ..store.manifestio import manifest_text
from ..store.remote import is_object_store, is_url, redact, secrets_hidden
from ..store.sourcecol import PREFIX
from ..store.splitdirs import check_split_out
from .config import BuildConfig, BuildResult, SplitsResult
from .executors import run_jobs
from .findsource import detect_raw, find_source
from .guards import check_apart, check_config, check_job_bytes, refuse
from .offline_variants import AUGMENT_EXTRAS, AugmentConfig
from .pool import WorkerCrashed
from .resume import existing_cache, read_partial, reusable, start_partial, write_sidecar
from .retire import collect, recorded_shards, remove_temps, remove_unrecorded_plan, retire
from .shardjob import ShardJob, ShardResult, run_shard_job
from .shardplan import (
    Content,
    PlannedShard,
    cache_fingerprint,
    default_shard_size,
    layout,
    option_changes,
    plan,
)
from .shardwrite import check_at_out, disk_full, remove_written
from .sources import Source
from .sources.classnames import read_names_file, with_class_order
from .sources.layouts import SORTED, VOC, layout_named
from .sources.recordfiles import pattern_folder
from .sources.sourceoptions import SourceOptions
from .sources.splitnames import Split
from .splits import find_splits, pick_splits, split_out
from .streamrun import job_options, stream_shards
from .strict import strict_refusal

__all__ = ["BuildConfig", "BuildResult", "SplitsResult", "build", "default_shard_size", "probe_shape"]

#: Annotations left out that the manifest lists by name (all are counted).
_DROPPED_LISTED = 1000


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


@dataclass(frozen=True)
class _Target:
    """What a build writes, resolved from its inputs and options."""

    raw: Path | str
    out: Location
    source: Source
    pipeline: Pipeline
    spec: SampleSpec
    content: Content
    content_fp: str
    augment: AugmentConfig | None
    extension: str


def build(
    raw,
    out: str | os.PathLike,
    config: BuildConfig = BuildConfig(),
    *,
    storage_options: dict | None = None,
    split=None,
    **source,
) -> BuildResult | SplitsResult:
    """Decode and preprocess every input of ``raw`` into a sharded cache at ``out``.

    ``raw`` is a folder of images (with ``config``'s labels, annotations, masks), Parquet files or
    WebDataset tars (``"data/train-*.parquet"``, ``"shards/train-{000000..000099}.tar"``), a Python
    dataset (``__len__`` and ``__getitem__``) or an iterable of samples. ``source``: the
    ``SourceOptions`` of such a source, as keywords (``classes=[...]``, ``box_format="xywh"``,
    ``source_id="v2"``, ``image_column=...``), or ``config.source``.

    ``raw`` and ``out`` may be fsspec URLs (``s3://bucket/cache``), reached with
    ``storage_options`` (or ``config.storage_options``; give them once): endpoint, key, secret, ...
    They go to every worker process (local or dask) as plain data and nowhere else: not into the
    cache, and no error message shows a secret of them.

    A ``raw`` that names splits (a YOLO data.yaml's ``train``/``val``/``test``, Hugging Face's
    ``data/train-*.parquet`` beside ``data/test-*.parquet``, ``train/`` and ``val/`` folders)
    builds one cache per split at ``out/<split>`` and returns a ``SplitsResult``; ``split``
    (``"train"``, ``"train,val"``, or ``config.split``) builds those only. Every split has the same
    class names in the same order, so class ids agree.
    """
    if split is not None:
        config = replace(config, split=split)
    if storage_options is not None:
        if config.storage_options and config.storage_options != storage_options:
            raise UsageError(
                "storage options given twice (build(storage_options=) and BuildConfig's); give them once"
            )
        config = replace(config, storage_options=dict(storage_options))
    if source:
        unknown = sorted(set(source) - {f.name for f in fields(SourceOptions)})
        if unknown:
            raise UsageError(f"build() got unknown options {', '.join(unknown)}")
        config = replace(config, source=replace(config.source, **source))
    with secrets_hidden(config.storage_options):
        detected = detect_raw(raw, out, config)  # once: the splits and the source follow its row
        splits = find_splits(raw, config.annotations, config.labels, config.storage_options, row=detected.row)
        if splits is None:
            if config.split is not None:
                raise UsageError(
                    f"--split {config.split if isinstance(config.split, str) else ','.join(config.split)}: "
                    f"{raw if isinstance(raw, (str, os.PathLike)) else type(raw).__name__} names no splits "
                    "(a data.yaml's train/val, train-*/test-* files or train/ val/ folders)"
                )
            return _build(raw, out, config, detected=detected)
        return _build_splits(raw, out, config, splits)


def _build_splits(raw, out, config: BuildConfig, splits: dict[str, Split]) -> SplitsResult:
    """One cache per split at ``out/<split>``: every split discovered (their class names made one
    list, in one order), inputs found in two splits reported, the chosen ones built."""
    chosen = pick_splits(splits, config.split, raw)
    check_config(config)
    if not is_url(os.fspath(raw)) and os.path.isdir(raw):
        check_apart(raw, out)  # not only apart from each split: a cache inside RAW would be read back
    location = open_location(out, config.storage_options)
    if location.exists() and location.read_text(MANIFEST_NAME) is not None:
        raise UsageError(
            f"{out} holds one cache of all of {raw}'s splits together; each split is now a cache of its "
            f"own at {out}/<split>: remove {out} or give another --out"
        )
    for name in chosen:  # never through a link: the readers would refuse what it was built into
        check_split_out(split_out(out, name))
    mask_names = read_names_file(config.mask_classes, "--mask-classes", 256) if config.mask_classes else None
    found = {}
    for name, split in splits.items():
        split_config = replace(
            config,
            annotations=split.annotations,
            masks=_split_folder(config.masks, name),
            arrays={k: _split_folder(v, name) for k, v in config.arrays.items()},
        )
        split_raw, source = find_source(
            split.raw, split_out(out, name), split_config, mask_classes=mask_names
        )
        if split.only is not None:
            source = _only(source, split)
        prefix = _split_prefix(raw, split_raw)
        if prefix:  # ds.source(i) puts it before each stored path: relative to RAW, as for one cache
            source = replace(source, extra={**source.extra, PREFIX: prefix})
        found[name] = (split_config, split_raw, source)
    names = _union_classes([s for _, _, s in found.values()])
    for name, (split_config, split_raw, source) in found.items():
        if tuple(source.classes) != names:
            found[name] = (
                split_config,
                split_raw,
                with_class_order(source, names, "the splits' class names"),
            )
    overlaps = _overlaps({n: s for n, (_, _, s) in found.items()}, raw)
    if overlaps:
        examples = ", ".join(overlaps[:3])
        warnings.warn(
            f"{len(overlaps)} inputs of {raw} are in more than one split, each built into every split "
            f"naming it: {examples}{' ...' if len(overlaps) > 3 else ''}",
            UserWarning,
            stacklevel=3,
        )
    results = {}
    for name in chosen:
        split_config, split_raw, source = found[name]
        if config.progress:
            print(f"split {name}: {len(source)} inputs -> {split_out(out, name)}", file=sys.stderr)
        results[name] = _build(split_raw, split_out(out, name), split_config, found=(split_raw, source))
    origin = next(iter(splits.values())).origin
    return SplitsResult(os.fspath(out), results, origin, len(overlaps))


def _split_prefix(raw, split_raw) -> str:
    """Where a split's inputs lie relative to ``raw``, the RAW the build was given (``images/train``,
    ``train``, ``data``; "" for the same folder): a split's source paths are relative to its own folder
    (a folder, or a pattern's), and ``ds.source(i)`` puts this before them."""
    here, there = _inputs_folder(raw), _inputs_folder(split_raw)
    if is_url(here):
        rel = posixpath.relpath(there.split("://", 1)[-1], here.split("://", 1)[-1])
    else:
        rel = os.path.relpath(os.path.abspath(there), os.path.abspath(here)).replace(os.sep, "/")
    return "" if rel == "." else rel


def _inputs_folder(raw) -> str:
    """The folder a source's paths are relative to: ``raw`` itself, or a pattern's folder."""
    text = os.fspath(raw)
    if not is_url(text) and os.path.isdir(text):
        return text
    return pattern_folder(text) or ("." if not is_url(text) else text)


def _split_folder(folder, name: str):
    """``folder/<split>`` when ``folder`` (a local folder of masks or arrays) has one, else ``folder``."""
    if folder is None or is_url(os.fspath(folder)):
        return folder
    sub = Path(folder) / name
    return str(sub) if sub.is_dir() else folder


def _only(source: Source, split: Split) -> Source:
    """The inputs of ``source`` a data.yaml lists for ``split`` (files, or folders of them); listed
    files it does not hold are reported as left out."""
    root = Path(split.raw)
    files = {p for p in split.only if not (root / p).is_dir()}
    folders = tuple(f"{p.rstrip('/')}/" for p in split.only if p not in files)
    keep = [i for i, p in enumerate(source.paths) if p in files or p.startswith(folders)]
    held = set(source.paths)
    held_by = f"{root}/images" if split.annotations != VOC.annotations else f"{root}/JPEGImages with an Annotations/ file"
    missing = [(p, f"listed by {split.origin} but not an image of {held_by}") for p in files - held]
    return source.subset(keep, [*split.missing, *sorted(missing)])


def _class_rule(source: Source) -> str | None:
    """How ``source``'s layout names its classes (``layouts``' SORTED, NUMBERED or LISTED)."""
    row = layout_named(source.layout)
    return row.class_names if row is not None else None


def _fast_decode_takes(source: Source) -> bool:
    """Whether ``source``'s layout may be decoded at a reduced size (its targets are not in the full
    image's pixels); a layout the table lacks may not."""
    row = layout_named(source.layout)
    return row is not None and row.fast_decode


def _union_classes(sources: list[Source]) -> tuple[str, ...]:
    """One class list for every split: an ImageFolder's sorted folder names, numbered classes up to
    the largest any split uses, else the names in order of appearance (a data.yaml's, the files')."""
    names: list[str] = []
    for source in sources:
        names += [c for c in source.classes if c not in names]
    if all(_class_rule(s) == SORTED or not s.classes for s in sources):
        return tuple(sorted(names))
    return tuple(names)


def _overlaps(sources: dict[str, Source], raw) -> list[str]:
    """Inputs that are the same file in more than one split (the same device and inode: one path
    twice, a symbolic or a hard link), each as its paths (relative to ``raw``) and splits, sorted:
    ``images/a.jpg (train and test)``, ``train/a.jpg (train) = val/b.jpg (val)``."""
    where: dict[object, list[tuple[str, str]]] = {}
    for name, source in sources.items():
        if source.reader is not None or is_url(os.fspath(source.root)):
            continue  # files of records: each file is one split's by construction
        for rel in source.paths:
            path = os.path.join(source.root, rel)
            try:
                st = os.stat(path)
                key: object = (st.st_dev, st.st_ino)
            except OSError:
                key = os.path.realpath(path)
            where.setdefault(key, []).append((os.path.relpath(path, raw), name))
    out = []
    for found in where.values():
        if len({name for _, name in found}) < 2:
            continue
        paths = {p: [n for q, n in found if q == p] for p, _ in found}
        out.append(" = ".join(f"{p} ({' and '.join(names)})" for p, names in paths.items()))
    return sorted(out)


def _build(
    raw: str | os.PathLike, out: str | os.PathLike, config: BuildConfig, *, found=None, detected=None
) -> BuildResult:
    started = time.perf_counter()
    check_config(config)
    location = open_location(out, config.storage_options)
    location.exists()  # an --out that is a file is refused before any work
    mask_names = read_names_file(config.mask_classes, "--mask-classes", 256) if config.mask_classes else None
    if mask_names is not None and config.masks is None:
        raise UsageError("--mask-classes names the values of --masks' class maps: give --masks too")
    if found is None:
        found = find_source(raw, out, config, mask_classes=mask_names, detected=detected)
    raw, source = found
    if config.classes is not None:  # one class order for any source
        source = with_class_order(source, read_names_file(config.classes, "--classes"), config.classes)
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
    spec = SampleSpec(shape=probe_shape(pipeline), extras=extras, fields=source.fields)
    kinds = spec.fields.values()
    unpaired = [f for f in kinds if f.kind == "keypoints" and f.params["k"] > 1 and "flip_idx" not in f.params]
    if augment is not None and augment.flip > 0 and unpaired:
        warnings.warn(  # baked into the cache: each flipped variant's left points on the right
            "--augment stores flipped variants, and the keypoints have no flip_idx: each point keeps its "
            "index, so left and right are not swapped; give --flip-idx (0,1,2,... when no point has a "
            "mirror partner) or --keypoint-names with left_/right_ names",
            UserWarning,
            stacklevel=3,
        )
    try:  # what the manifest will say must read back: field names, sizes, no clash with a column
        SampleSpec.from_json(json.loads(json.dumps(spec.to_json())))
    except CacheError as exc:
        raise UsageError(f"these samples cannot be stored: {exc}") from None
    if (
        config.fast_decode
        and any(f.kind == "mask" for f in spec.fields.values())
        or (config.fast_decode and (not _fast_decode_takes(source) or source.reader is not None))
    ):
        raise UsageError(
            "--fast-decode decodes JPEGs at a reduced size, and masks and COCO, VOC and other sources' "
            "boxes are in the full image's pixels: leave --fast-decode out (YOLO's normalised boxes take it)"
        )
    if augment is not None and spec.ragged:
        raise UsageError(
            f"--augment needs a recipe with a fixed output size; {pipeline.name!r} keeps each image's"
        )
    pipeline_json = pipeline.to_json() | {"fast_decode": config.fast_decode}
    if "boxes" in {f.kind for f in source.fields.values()}:
        pipeline_json["min_visibility"] = config.min_visibility
    if augment is not None:
        pipeline_json["augment"] = augment.to_json()
    content = Content(
        pipeline_json, fmt.name, options, spec.to_json(), source.classes, {"max_pixels": config.max_pixels}
    )
    target = _Target(
        raw, location, source, pipeline, spec, content, content.fingerprint(), augment, fmt.extension
    )
    location.mkdir()
    with location.lock():
        try:
            if getattr(source.reader, "stream", False):  # an iterable: its shards are built as it is read
                target, config, streamed = stream_shards(target, config)
                return streamed.result(_run(target, config, started))
            return _run(target, config, started)
        except BaseException:
            with contextlib.suppress(Exception):  # never hide the error that stopped the build
                remove_temps(location)  # a killed worker's half-written shard; records stay for resume
            raise


def _run(t: _Target, config: BuildConfig, started: float) -> BuildResult:
    out, source = t.out, t.source
    previous, text = existing_cache(out)
    partial = read_partial(out)
    requested = {
        "order": config.order,
        "seed": config.seed,
        "shard_size": config.shard_size,
        "shards": config.shards,
    }
    if getattr(source.reader, "sequential", False):  # files of records are read in their own order
        requested["order"] = "sorted"
    if config.overwrite:
        kept = None  # a fresh cut
    elif previous is not None:
        kept = {"order": previous.order, "shard_size": previous.format_options.get("shard_size")}
    else:
        kept = partial.layout if partial is not None else None
    target = DEFAULT_REMOTE_SHARD_BYTES if is_object_store(out.url) else DEFAULT_SHARD_BYTES
    per_input = t.spec.nbytes * (
        t.augment.variants if t.augment is not None else 1
    )  # a shard's rows are inputs
    order, shard_size = layout(source, per_input, requested, kept, target)
    check_job_bytes(shard_size, t.augment.variants if t.augment is not None else 1, t.spec.nbytes)
    fingerprint = cache_fingerprint(t.content_fp, order, shard_size, source)
    seed = config.seed if (order["kind"] == "shuffled" or t.augment is not None) else None
    changes = option_changes(previous, t.content, order, shard_size, seed) if previous is not None else []
    refuse(out, t.raw, len(source), config, previous, text, changes, fingerprint, partial)
    grace = DEFAULT_GRACE_SECONDS if config.grace is None else config.grace
    referenced = _referenced(previous, text)
    if partial is None and out.names(PARTIAL_DIR):  # records whose plan is lost (killed while removed)
        remove_unrecorded_plan(out, (), referenced)

    if (
        previous is not None
        and previous.fingerprint == fingerprint
        and not any(s.retry for s in previous.skipped)
        and all(reusable(out, s, verify=False) for s in previous.shards)
    ):  # up to date: only clean what an interrupted run left
        if partial is not None:  # this run's, or an abandoned run's with other options: the cache
            remove_unrecorded_plan(out, partial.planned, referenced)  # in place is the one kept
        remove_temps(out)
        removed = collect(out, referenced, grace)
        return BuildResult(
            previous, out.url, "up to date", 0, 0, time.perf_counter() - started, removed=len(removed)
        )

    planned = plan(source, order, shard_size, t.content_fp, t.extension)
    remove_temps(out)
    # Shards are named by their content, so an unfinished build's finished shard is reusable
    # whenever this build plans its name, even if that build had other inputs or options.
    finished = partial.finished if partial is not None else {}
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
    shards = [results[i].info for i in range(len(planned))]
    skipped = [SkippedInput(p, r) for p, r in source.ignored]
    for i in range(len(planned)):
        skipped.extend(results[i].skipped)
    if config.strict and (skipped or source.dropped):
        remove_unrecorded_plan(out, names, referenced)
        raise BuildError(strict_refusal([(s.path, s.reason) for s in skipped], list(source.dropped), out.url))
    if sum(s.samples for s in shards) == 0:
        remove_unrecorded_plan(out, names, referenced)
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:3])
        raise UsageError(f"{t.raw}: none of the {len(source)} inputs could be decoded ({reasons})")
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
    removed = collect(out, current, grace)
    if finished and reused:
        status = "resumed"
    elif previous is not None and not config.overwrite:
        status = "updated"
    else:
        status = "built"
    return BuildResult(
        manifest,
        out.url,
        status,
        len(jobs),
        reused,
        time.perf_counter() - started,
        retired - len(removed),
        len(removed),
    )


def _job(t: _Target, config: BuildConfig, index: int, shard: PlannedShard, paths: list[str]) -> ShardJob:
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


def _run_jobs(t: _Target, config: BuildConfig, jobs: list[ShardJob], results: dict[int, ShardResult]) -> None:
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
    t: _Target, order: dict, shard_size: int, fingerprint: str, shards: list[ShardInfo], skipped
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
