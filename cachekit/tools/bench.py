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
warm epochs spread by more than ``benchresult.SPREAD_WARNING`` of that median is named in a warning
(``benchtiming`` times a row, ``benchresult`` compares the rows and records the run).
OpenCV runs on one thread per process throughout, as in a build's workers and like PIL, so
"N workers" means N cores for every loader.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..augment.plan import compile_plan
from ..augment.spec import parse_spec
from ..augment.transforms import RandomHorizontalFlip, RandomResizedCrop
from ..build.sources.splitnames import SPLIT_NAMES
from ..build.splits import find_splits
from ..constants import DEFAULT_PIPELINE
from ..cpus import available_cpus
from ..errors import UsageError
from ..feed.dataset import CachedDataset
from ..feed.shm import shm_shortfall
from ..image.recipes import load_pipeline
from ..image.threads import opencv_single_threaded
from ..store.remote import is_url
from ..store.splitdirs import choose_split
from .baselines import BACKENDS, RawImageDataset, check_raw_inputs, classification_recipe
from .benchresult import RunFigures, compare_rows, copy_limit_warnings, ratios, raw_unit, result_record
from .benchrows import MAX_AUGMENT_SIZE, augment_size, cache_row, make_loader_row, raw_row
from .benchsamples import align_samples, cache_pipeline, raw_discovery
from .benchtiming import measure, memcpy_bandwidth
from .benchview import augment_text, cache_names, format_table, plot_result, workers_text
from .preview import short_spec

__all__ = [
    "BenchConfig",
    "DEFAULT_REPEATS",
    "DEFAULT_WORKERS",
    "MIN_BATCHES",
    "run_bench",
    "raw_split",
    "spec_steps",
    "format_table",
    "plot_result",
]


#: Worker counts each loader is timed with when none are given.
DEFAULT_WORKERS = (0, 2)
#: Warm epochs each row is timed for when neither ``repeats`` nor ``epochs`` is given.
DEFAULT_REPEATS = 3
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


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


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
    crop, steps = _augmentation(config, caches, datasets, log)
    names = cache_names(caches, [d.manifest.format for d in datasets])
    inputs, backends = _raw_inputs(raw, datasets, config.raw_backends, crop, log, progress)
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
    said = _few_batches(n, config.batch_size, log)
    counts = _worker_counts(config, _sample_bytes(crop, datasets) * config.batch_size, log)
    rows = []

    def add(name, workers, make, files):
        rows.append(measure(name, workers, make, files, passes=config.passes(), cold=config.cold, limit=n,
                            progress=progress))  # fmt: skip
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

    baseline = compare_rows(rows, said, log)
    memcpy = memcpy_bandwidth()
    headline = ratios(rows, baseline, None if crop else memcpy)
    copy_limit_warnings(headline, said, log)
    figures = RunFigures(samples=n, aligned_by=align.by, crop=crop, steps=steps, memcpy=memcpy, rows=rows,
                         baseline=baseline, ratios=headline, warnings=said)  # fmt: skip
    return result_record(figures, config, raw, inputs, caches, datasets, names)


def _augmentation(config: BenchConfig, caches, datasets, log) -> tuple[tuple[int, int] | None, list | None]:
    """The size every row crops to (None: no augmentation) and ``--augment SPEC``'s transforms (None:
    the default random resized crop + flip, which every row runs); a variable-sized cache with no
    crop is one line."""
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
    return crop, steps


def _raw_inputs(raw, datasets, backends: tuple[str, ...], crop, log, progress: bool):
    """The raw inputs a build keeps (None without raw rows) and the raw backends that read them
    (PIL only for the classification recipe or a crop); what a build skips is logged."""
    if raw is None or not backends:
        return None, backends
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
        f"raw: {inputs.found} {raw_unit(inputs)}, {len(inputs.skipped)} skipped as a build would skip them"
        + (f", {len(inputs.refused)} more left out for PIL" if inputs.refused else "")
    )
    return inputs, backends


def _few_batches(n: int, batch_size: int, log) -> list[str]:
    """The run's warnings so far: one (logged) when an epoch is too few batches for its figures."""
    said = []
    batches = -(-n // batch_size)
    if batches < MIN_BATCHES:
        said.append(
            f"only {batches} batch{'es' if batches > 1 else ''} of {batch_size} an epoch: each row's "
            "speed is mostly its start-up, so rows may rank in another order than on a real epoch; "
            f"give more --samples or a smaller --batch-size (at least {MIN_BATCHES} batches)"
        )
        log(f"warning: {said[-1]}")
    return said


def spec_steps(spec: str) -> list:
    """``--augment SPEC`` as transforms (UsageError in one line when it is not a list of them)."""
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
