"""``cachekit bench``: the raw folder (PIL, OpenCV) and each cache, loaded side by side in one run.

Every row reads the same samples (``benchsamples``), in one seeded shuffled order, with the same
batch size and worker count; the raw rows only the inputs a build keeps, since every raw file is
first read and decoded once through the build's own code (``baselines.check_raw_inputs``), and
those a build skips are counted and listed with a build's reasons. The "make_loader" row is the
cache through ``make_loader``'s defaults (its own shard-aware shuffle, stopped after the same
number of samples): the setting a user gets without tuning; a fixed-size cache's samples all cost
the same to read.

With ``augment`` every row also does a random resized crop to one size and a random flip per
sample, each the way its kind of user would (``benchrows``); caches of variable-sized samples
(``--pipeline train-256``) are then welcome, since every row's output has one size.

Epoch 1 starts from a cold page cache where the OS allows dropping it; the ``repeats`` epochs after
it are warm, and a row's figure is their median, with their min and max beside it: a row whose
warm epochs spread by more than ``SPREAD_WARNING`` of that median is named in a warning.
OpenCV runs on one thread per process throughout, as in a build's workers and like PIL, so
"N workers" means N cores for every loader.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..augment.transforms import RandomHorizontalFlip, RandomResizedCrop
from ..build.sources.splitnames import SPLIT_NAMES
from ..constants import DEFAULT_PIPELINE, VERSION
from ..cpus import available_cpus
from ..errors import CachekitError, UsageError
from ..feed.dataset import CachedDataset
from ..feed.shm import shm_shortfall
from ..image.recipes import load_pipeline
from ..image.threads import opencv_single_threaded
from ..store.remote import is_url
from ..store.splitdirs import choose_split
from .baselines import BACKENDS, RawImageDataset, RawInputs, check_raw_inputs, classification_recipe
from .benchrows import MAX_AUGMENT_SIZE, augment_record, augment_size, cache_row, make_loader_row, raw_row
from .benchsamples import align_samples, cache_pipeline, raw_discovery
from .benchview import augment_text, cache_names, format_table, plot_result, workers_text
from .preview import short_spec

__all__ = [
    "BenchConfig",
    "DEFAULT_REPEATS",
    "DEFAULT_WORKERS",
    "SPREAD_WARNING",
    "MIN_BATCHES",
    "run_bench",
    "format_table",
    "plot_result",
    "memcpy_bandwidth",
    "drop_page_cache",
]


#: Worker counts each loader is timed with when none are given.
DEFAULT_WORKERS = (0, 2)
#: Warm epochs each row is timed for when neither ``repeats`` nor ``epochs`` is given.
DEFAULT_REPEATS = 3
#: A row whose warm epochs' (max - min) / median passes this is named in a warning.
SPREAD_WARNING = 0.25
#: Batches an epoch below which a row's speed is mostly its start-up (workers, first reads): the
#: figures are still printed, with a warning that says so.
MIN_BATCHES = 10
#: prefetch_factor of the bench's DataLoaders (torch's default).
_PREFETCH = 2


@dataclass(frozen=True)
class BenchConfig:
    """What ``run_bench`` measures: batch size, worker counts, samples and epochs per row, backends.

    ``augment``: every row does a random resized crop + flip per sample (``benchrows``), to
    ``augment_size`` (default: the caches' own size, or 224 when their samples vary in size).

    ``repeats``: warm epochs timed per row after its first epoch (default ``DEFAULT_REPEATS``);
    ``epochs``, the older way to say it: epochs in all, the first one cold (``repeats`` is then
    ``epochs - 1``, or the one epoch). Give one or the other.
    """

    batch_size: int = 256
    workers: tuple[int, ...] | None = None  # None: DEFAULT_WORKERS, those /dev/shm can serve
    samples: int | None = None  # None: every sample
    epochs: int | None = None  # None: 1 + repeats
    repeats: int | None = None  # None: DEFAULT_REPEATS (or from epochs)
    seed: int = 0
    cold: bool = True  # drop the files from the page cache before epoch 1
    raw_backends: tuple[str, ...] = ("pil", "opencv")
    augment: bool = False
    augment_size: int | None = None
    #: ``--augment SPEC``: the transforms the make_loader rows run (``cachekit.augment.spec``); the
    #: raw and per-sample rows, which know only RandomResizedCrop + flip, are then left out.
    augment_spec: str | None = None

    def passes(self) -> int:
        """Epochs each row runs: the first one (cold where the OS allows), then the warm repeats."""
        if self.epochs is not None:
            return self.epochs
        return 1 + (DEFAULT_REPEATS if self.repeats is None else self.repeats)

    def check(self) -> None:
        """Refuse settings no run could use (UsageError), before any work starts."""
        if self.batch_size < 1 or (self.epochs is not None and self.epochs < 1):
            raise UsageError("--batch-size and --epochs must be at least 1")
        if self.repeats is not None and self.repeats < 1:
            raise UsageError("--repeats must be at least 1")
        if self.repeats is not None and self.epochs is not None:
            raise UsageError("give --repeats (warm epochs) or --epochs (epochs in all), not both")
        if self.samples is not None and self.samples < 1:
            raise UsageError("--samples must be at least 1")
        if self.workers is not None and (not self.workers or min(self.workers) < 0):
            raise UsageError("--workers takes worker counts of 0 or more, such as 0,2")
        unknown = set(self.raw_backends) - set(BACKENDS)
        if unknown:
            raise UsageError(
                f"unknown raw backend {sorted(unknown)[0]!r} (choose from {', '.join(BACKENDS)})"
            )
        if self.augment_spec is not None:
            if not self.augment:
                raise UsageError("an augment spec goes with augment=True (--augment SPEC)")
            spec_steps(self.augment_spec)  # refused in one line before any work
        if self.augment_size is not None:
            if not self.augment:
                raise UsageError("--augment-size needs --augment")
            if not 1 <= self.augment_size <= MAX_AUGMENT_SIZE:
                raise UsageError(f"--augment-size must be between 1 and {MAX_AUGMENT_SIZE}")


def drop_page_cache(files: Iterable[Path]) -> bool:
    """Ask the OS to forget the files' cached pages (``posix_fadvise(DONTNEED)``); False if it can't."""
    if not hasattr(os, "posix_fadvise"):
        return False
    ok = True
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            ok = False
            continue
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


def memcpy_bandwidth(nbytes: int = 256 * 1024 * 1024, repeats: int = 5) -> float:
    """Bytes per second one core copies between two large buffers (best of ``repeats``)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def _epoch(loader, limit: int, bar) -> dict:
    """Time one pass that delivers ``limit`` samples: total seconds and time to the first batch."""
    t0 = time.perf_counter()
    first, samples, nbytes = None, 0, 0
    for images, labels in loader:
        if first is None:
            first = time.perf_counter() - t0
        samples += len(labels)
        nbytes += images.numel() * images.element_size()
        bar.update(len(labels))
        if samples >= limit:
            break
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": samples, "bytes": nbytes, "first_batch_s": first or seconds}


def _one_line(exc: CachekitError) -> CachekitError:
    """A CachekitError raised in a DataLoader worker arrives wrapped in a traceback; keep its own line."""
    text = str(exc)
    if "Original Traceback" not in text:
        return exc
    last = [line for line in text.splitlines() if line.strip()][-1]
    return type(exc)(last.split(": ", 1)[1] if ": " in last else last)


def _measure(
    name: str,
    workers: int | str,
    make: Callable,
    files: list[Path],
    config: BenchConfig,
    limit: int,
    progress: bool,
) -> dict:
    from tqdm import tqdm

    cold = drop_page_cache(files) if config.cold else False
    loader, extra = make()
    epochs = []
    desc = f"{name}, {workers_text({'workers': workers, **extra})}"
    passes = config.passes()
    with tqdm(total=passes * limit, unit="img", desc=desc, disable=not progress, leave=False) as bar:
        for e in range(passes):
            try:
                rec = _epoch(loader, limit, bar)
            except CachekitError as exc:
                raise _one_line(exc) from None
            rec["epoch"] = e + 1
            rec["cold"] = cold and e == 0
            rec["samples_per_s"] = rec["samples"] / rec["seconds"]
            rec["MB_per_s"] = rec["bytes"] / rec["seconds"] / 1e6
            epochs.append(rec)
    dataset = loader.dataset
    del loader
    gc.collect()  # shut persistent workers down and unmap their files before the next row
    if isinstance(dataset, CachedDataset):
        dataset.close()
    warm = [r["samples_per_s"] for r in epochs[1:] or epochs]
    samples_per_s = statistics.median(warm)
    bytes_per_sample = epochs[0]["bytes"] / max(1, epochs[0]["samples"])
    return {
        "loader": name,
        "workers": workers,
        **extra,
        "samples_per_s": samples_per_s,  # the median of the warm epochs
        "samples_per_s_min": min(warm),
        "samples_per_s_max": max(warm),
        "repeats": len(warm),
        "spread": (max(warm) - min(warm)) / samples_per_s,
        "bytes_per_sample": bytes_per_sample,
        "MB_per_s": samples_per_s * bytes_per_sample / 1e6,
        "first_batch_s": epochs[0]["first_batch_s"],
        "epoch1_samples_per_s": epochs[0]["samples_per_s"],
        "epochs": epochs,
    }


def run_bench(
    raw: str | os.PathLike | None,
    caches: Sequence[str | os.PathLike],
    config: BenchConfig = BenchConfig(),
    *,
    log: Callable[[str], None] = lambda line: None,
    progress: bool = False,
    storage_options: dict | None = None,
    split: str | None = None,
) -> dict:
    """Measure every loader; return a JSON-able dict of the figures, the machine and the ratios.

    A cache may be an fsspec URL, reached with ``storage_options`` (never recorded): its rows
    include fetching its shards into the node's local shard cache.

    A cache may be a folder of split caches (a build of a RAW that names splits): its ``split``
    is benched, by default ``train`` when it holds one; a ``raw`` that names splits is then that
    split's inputs only, so that the raw rows read what the cache holds.
    """
    config.check()
    if not caches and (raw is None or not config.raw_backends):
        raise UsageError("nothing to benchmark: give a raw folder and/or caches")
    chosen = []
    for c in caches:
        path, note = choose_split(c, split)
        if note is not None:
            log(note)
        chosen.append(path)
    picked = split if split is not None else ("train" if list(map(str, caches)) != chosen else None)
    named = picked is not None
    if not named and chosen and not is_url(chosen[0]) and Path(chosen[0]).name in SPLIT_NAMES:
        picked = Path(chosen[0]).name  # OUT/val given as it is: RAW's val, when RAW names splits
    caches = chosen
    datasets = []
    try:
        for c in caches:
            datasets.append(CachedDataset(c, storage_options=storage_options))
        if picked is not None and raw is not None and datasets:
            given = raw
            raw = raw_split(raw, picked, datasets[0].manifest, storage_options, named)
            if raw != given:
                log(f"raw: split {picked} of {given}: {raw}")
        with opencv_single_threaded():
            return _run(raw, caches, datasets, config, log, progress, storage_options)
    finally:
        for d in datasets:
            d.close()


def raw_split(raw, name: str, manifest, storage_options=None, named: bool = True) -> str:
    """The inputs of split ``name`` of ``raw``, what a cache of that split was built from: a folder,
    a pattern of files, or the root of a data.yaml's lists (the rows then matched by source path).
    ``raw`` itself when it names no splits, or not this one and the split was guessed from a cache
    folder's name; a split the user named that RAW does not hold is one line."""
    import warnings

    from ..build.splits import find_splits

    options = raw_discovery(manifest, raw)
    with warnings.catch_warnings():  # what a build of RAW would report is not bench's to say
        warnings.simplefilter("ignore")
        splits = find_splits(raw, options.get("annotations"), None, storage_options)
    if splits is None or (name not in splits and not named):
        return raw
    if name not in splits:
        raise UsageError(
            f"{raw} holds the splits {', '.join(splits)}, not {name}: give --split one of them, "
            f"or the raw inputs of split {name}"
        )
    return splits[name].raw


def _run(raw, caches, datasets, config: BenchConfig, log, progress: bool, storage_options) -> dict:
    crop = augment_size(config, caches, datasets)
    steps = spec_steps(config.augment_spec) if config.augment_spec is not None else None
    if steps is not None and crop is not None and steps == [RandomResizedCrop(crop), RandomHorizontalFlip()]:
        steps = None  # the default recipe: every row runs it
    if steps is not None:
        log(f"--augment {short_spec(steps)}: only the make_loader rows run it (the raw and per-sample "
            "rows know RandomResizedCrop + flip only)")  # fmt: skip
        crop = _fixed(steps, crop)
    for path, d in zip(caches, datasets):
        if d.ragged and crop is None:
            raise UsageError(
                f"{path}: its samples have different sizes; compare it with --augment (every row "
                "crops to one size), or bench a fixed-size cache"
            )
    names = cache_names(caches, [d.manifest.format for d in datasets])
    inputs = None
    backends = config.raw_backends
    if raw is not None and backends:
        pipeline = cache_pipeline(datasets[0]) if datasets else load_pipeline(DEFAULT_PIPELINE)
        if "pil" in backends and not crop and not classification_recipe(pipeline):
            backends = tuple(b for b in backends if b != "pil")
            log(f"no raw-pil rows: the PIL loader runs the classification recipe only, not {pipeline.name!r}")
        inputs = check_raw_inputs(
            raw,
            pipeline,
            pil="pil" in backends,
            workers=available_cpus(),
            progress=progress,
            discover_options=raw_discovery(datasets[0].manifest, raw) if datasets else {},
        )
        for path, reason in inputs.skipped[:10]:
            log(f"skipped {path}: {reason}")
        if len(inputs.skipped) > 10:
            log(f"... and {len(inputs.skipped) - 10} more skipped (see --json)")
        for path, reason in inputs.refused[:10]:
            log(f"left out {path}: {reason}")
        log(
            f"raw: {inputs.found} {_unit(inputs)}, {len(inputs.skipped)} skipped as a build would skip them"
            + (f", {len(inputs.refused)} more left out for PIL" if inputs.refused else "")
        )
    raw_ds = {b: RawImageDataset(inputs, backend=b, augment=crop) for b in backends} if inputs else {}
    if steps is not None:
        raw_ds = {}
    align = align_samples(inputs, datasets, samples=config.samples, seed=config.seed)
    n = len(align)
    if n == 0:
        raise UsageError(f"{raw}: no image a build could use, nothing to compare")
    log(f"{n} samples per epoch in every row, matched by {align.by}")
    if crop and steps is None:
        log(f"augmented: every row does {augment_text(crop)} per sample")
    warnings = []
    batches = -(-n // config.batch_size)
    if batches < MIN_BATCHES:
        warnings.append(
            f"only {batches} batch{'es' if batches > 1 else ''} of {config.batch_size} an epoch: each row's "
            "speed is mostly its start-up, so rows may rank in another order than on a real epoch; "
            f"give more --samples or a smaller --batch-size (at least {MIN_BATCHES} batches)"
        )
        log(f"warning: {warnings[-1]}")
    counts = _worker_counts(config, _sample_bytes(crop, datasets) * config.batch_size, log)
    rows = []

    def add(name, workers, make, files):
        rows.append(_measure(name, workers, make, files, config, n, progress))
        r = rows[-1]
        log(
            f"{name}, {workers_text(r)}: {r['samples_per_s']:,.0f} samples/s warm, "
            f"first batch {r['first_batch_s']:.2f} s"
        )

    bs = config.batch_size
    for backend, ds in raw_ds.items():
        for w in counts:
            add(f"raw-{backend}", w, raw_row(ds, align.raw, w, bs), ds.files())
    for path, name, order in zip(caches, names, align.caches):
        files = [] if is_url(path) else _files(Path(path))  # a URL cache's copies are fetched afresh
        for w in counts if steps is None else ():
            add(name, w, cache_row(path, order, w, bs, crop, storage_options), files)
        add(name, "make_loader", make_loader_row(path, bs, config.seed, crop, storage_options, steps), files)

    raw_rows = [r for r in rows if r["loader"].startswith("raw-")]
    baseline = max(raw_rows, key=lambda r: r["samples_per_s"]) if raw_rows else None
    for r in rows:
        for key, speed in (("speedup", "samples_per_s"), ("speedup_min", "samples_per_s_min"),
                           ("speedup_max", "samples_per_s_max")):  # fmt: skip
            r[key] = r[speed] / baseline["samples_per_s"] if baseline else None
        if r["spread"] > SPREAD_WARNING:
            warnings.append(_spread_warning(r))
            log(f"warning: {warnings[-1]}")
    memcpy = memcpy_bandwidth()
    ratios = _ratios(rows, baseline, None if crop else memcpy)
    for key, value in ratios.items():
        if key.endswith("/ memcpy") and value > 1.0:
            warnings.append(
                f"{key} is {value:.2f}: over the copy limit, which no loader can pass; this figure "
                "cannot be trusted (too few batches timed, or the clock caught a pause)"
            )
            log(f"warning: {warnings[-1]}")
    return {
        "cachekit_version": VERSION,
        "config": asdict(config),
        "samples": n,
        "repeats": max(1, config.passes() - 1),  # warm epochs behind each row's median, min and max
        "aligned_by": align.by,
        "augment": augment_record(crop, steps) if crop else None,
        "machine": {
            "cpus_usable": available_cpus(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "memcpy_MB_per_s": memcpy / 1e6,
        },
        "raw": _raw_summary(raw, inputs),
        "caches": [
            {
                "name": name,
                "path": str(p),
                "format": d.manifest.format,
                "bytes": d.manifest.total_bytes,
                "samples": len(d),
                "shape": list(d.sample_shape),
                "pipeline": d.manifest.pipeline.get("name"),
            }
            for name, p, d in zip(names, caches, datasets)
        ],
        "rows": rows,
        "baseline": {k: baseline[k] for k in ("loader", "workers", "samples_per_s")} if baseline else None,
        "ratios": ratios,
        "warnings": warnings,
    }


def _spread_warning(row: dict) -> str:
    """One line naming a row whose warm epochs disagree too much for its median to be trusted."""
    return (
        f"{row['loader']}, {workers_text(row)}: its {row['repeats']} warm epochs ran "
        f"{row['samples_per_s_min']:,.0f}-{row['samples_per_s_max']:,.0f} samples/s, a spread of "
        f"{row['spread']:.0%} of the median (over {SPREAD_WARNING:.0%}): the machine was busy or an "
        "epoch is too short; rerun with more --repeats or --samples before trusting its ratio"
    )


def spec_steps(spec: str) -> list:
    """``--augment SPEC`` as transforms (UsageError in one line when it is not a list of them)."""
    from ..augment.spec import parse_spec

    try:
        steps = parse_spec(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not steps:
        raise UsageError(
            "--augment SPEC names no transform; give --augment alone for RandomResizedCrop + flip"
        )
    return steps


def _fixed(steps: list, crop: tuple[int, int] | None) -> tuple[int, int] | None:
    """The size a spec ends in (what every row's samples are then), else the rows' crop size."""
    from ..augment.plan import compile_plan

    return compile_plan(steps).fixed_size() or crop


def _sample_bytes(crop: tuple[int, int] | None, datasets: Sequence[CachedDataset]) -> int:
    """Bytes of the largest sample any row hands over (raw rows run a cache's recipe, or crop)."""
    if crop:
        return 3 * crop[0] * crop[1]
    return max((d.manifest.sample.nbytes for d in datasets), default=3 * 224 * 224)


def _worker_counts(config: BenchConfig, batch_bytes: int, log) -> tuple[int, ...]:
    """The worker counts to time: asked-for ones /dev/shm cannot serve are a UsageError, default
    ones are left out with a warning (a container's 64 MB /dev/shm)."""
    counts = config.workers if config.workers is not None else DEFAULT_WORKERS
    short = {w: shm_shortfall(batch_bytes, w, _PREFETCH) for w in counts}
    short = {w: why for w, why in short.items() if why}
    if short and config.workers is not None:
        w, why = next(iter(short.items()))
        raise UsageError(f"--workers {w}: {why}")
    for w, why in short.items():
        log(f"warning: no {w}-worker rows: {why}")
    return tuple(w for w in counts if w not in short)


def _unit(inputs: RawInputs) -> str:
    """What the raw inputs are: files of their own, or records of Parquet files, tars or a dataset."""
    return "records" if inputs.reads is not None and inputs.reads.reader is not None else "image files"


def _raw_summary(raw, inputs: RawInputs | None) -> dict | None:
    if inputs is None:
        return None
    return {
        "path": str(raw),
        "unit": _unit(inputs),
        "bytes": inputs.bytes,
        "found": inputs.found,
        "usable": len(inputs),
        "pipeline": inputs.pipeline.name,
        "skipped": [{"path": p, "reason": r} for p, r in inputs.skipped],
        "left_out_for_pil": [{"path": p, "reason": r} for p, r in inputs.refused],
    }


def _ratios(rows: list[dict], baseline: dict | None, memcpy: float | None) -> dict:
    """The headline figures: cache via make_loader's defaults vs the baseline, and vs memcpy
    (None for augmented rows, whose speed a resize bounds, not a copy)."""
    out = {}
    for r in rows:
        if r["workers"] == "make_loader":
            key = r["loader"]
            if baseline:
                out[f"{key} make_loader / {baseline['loader']} best"] = (
                    r["samples_per_s"] / baseline["samples_per_s"]
                )
            if memcpy:
                out[f"{key} make_loader / memcpy"] = r["MB_per_s"] * 1e6 / memcpy
    return out
