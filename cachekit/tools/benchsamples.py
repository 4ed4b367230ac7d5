"""Which samples every row of ``cachekit bench`` reads, so that all rows compare the same images.

The raw rows index the inputs a build keeps (``baselines.RawInputs``); each cache row indexes its
cache. Rows are matched by source path when every cache names each sample's source file, else by
position (the k-th input a build keeps is sample k of a cache built from it in path order, or
sample k * K with K augmented variants per input). Files PIL cannot read are left out of every row.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..build.sources.layouts import BENCH_ANNOTATIONS, BENCH_RECORDS, layout_named
from ..feed.dataset import CachedDataset
from ..image.recipes import Pipeline, Step
from ..store.sourcecol import source_prefix
from .baselines import RawInputs

__all__ = ["raw_discovery", "Alignment", "align_samples", "cache_pipeline"]


def cache_pipeline(dataset: CachedDataset) -> Pipeline:
    """The recipe a cache was built with, as recorded in its manifest (the raw rows run it too)."""
    p = dataset.manifest.pipeline
    steps = tuple(Step(s["op"], {k: v for k, v in s.items() if k != "op"}) for s in p.get("steps", []))
    return Pipeline(name=str(p.get("name", "cache")), size=p.get("size"), steps=steps)


def raw_discovery(manifest, raw) -> dict:
    """How to find a cache's inputs in RAW again: its annotations (YOLO, or the COCO file of the
    name the manifest records, in RAW) and mask folder, as ``discover`` takes them."""
    source = manifest.source
    options = {}
    row = layout_named(source.get("layout"))
    how = row.bench_raw if row is not None else None
    if how == BENCH_ANNOTATIONS and row.annotations is not None:  # named by --annotations (yolo)
        options["annotations"] = row.annotations
    elif how == BENCH_ANNOTATIONS and source.get("annotations"):  # the file of that name in RAW (COCO's)
        options["annotations"] = os.path.join(str(raw), source["annotations"])
    if how == BENCH_RECORDS:  # read its files as the build did
        options["source"] = {k: source[k] for k in ("columns", "box_format") if k in source}
    if source.get("masks") and not str(source["masks"]).startswith(("s3://", "gs://")):
        options["masks"] = source["masks"]
    return options


def _sample_sources(ds: CachedDataset) -> list[str] | None:
    """Each sample's source path when the cache records them, else None: relative to the folder its
    inputs were found in (a split's own, which the raw rows read: ``bench.raw_split``), as a build
    stores them before ``ds.source`` puts the split's folder in front."""
    source = getattr(ds, "source", None)
    if not callable(source):
        return None
    prefix = source_prefix(ds.manifest.source, "manifest.json")
    return [source(i)[len(prefix) :] for i in range(len(ds))]


@dataclass(frozen=True)
class Alignment:
    """Which sample each row reads, in order: ``raw`` indexes ``RawInputs.paths``, ``caches`` each cache."""

    raw: list[int]
    caches: list[list[int]]
    by: str  # "source path" | "position"

    def __len__(self) -> int:
        return len(self.caches[0]) if self.caches else len(self.raw)


def align_samples(
    raw: RawInputs | None,
    datasets: Sequence[CachedDataset],
    *,
    samples: int | None = None,
    seed: int = 0,
) -> Alignment:
    """Pick the samples every row reads: ``samples`` (default all) of those every row can read, in
    an order drawn from ``seed``.

    Matched by source path when every cache names its samples' sources; else by position (input k
    a build keeps is sample k of a cache, or sample k * K of one with K augmented variants per
    input). Inputs PIL refuses are left out of every row.
    """
    left_out = {p for p, _ in raw.refused} if raw is not None else set()
    sources = [_sample_sources(d) for d in datasets]
    if all(s is not None for s in sources):
        maps = []
        for keys in ([list(raw.paths)] if raw is not None else []) + sources:
            index: dict[str, int] = {}
            for i, key in enumerate(keys):
                index.setdefault(key, i)  # an augmented cache's first variant of each input
            maps.append(index)
        common = [k for k in maps[0] if k not in left_out and all(k in m for m in maps[1:])]
        if common:
            chosen = _shuffled(common, samples, seed)
            rows = [[m[k] for k in chosen] for m in maps]
            return Alignment(rows.pop(0) if raw is not None else [], rows, "source path")
    # an augmented cache holds each input's variants side by side: input k starts at k * group_size
    groups = [d.group_size for d in datasets]
    lengths = [len(d) // g for d, g in zip(datasets, groups)] + ([len(raw)] if raw is not None else [])
    positions = [k for k in range(min(lengths)) if raw is None or raw.paths[k] not in left_out]
    chosen = _shuffled(positions, samples, seed)
    return Alignment(chosen if raw is not None else [], [[k * g for k in chosen] for g in groups], "position")


def _shuffled(items: list, samples: int | None, seed: int) -> list:
    n = min(len(items), samples or len(items))
    return [items[i] for i in np.random.default_rng(seed).permutation(len(items))[:n]]
