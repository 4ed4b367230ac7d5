"""Build orchestration: ``build``, the entry of every build (the Python API, ``cachekit build``): the
options merged, RAW's layout detected once, its splits found, then one cache (``cacherun``) or one
cache per split (``splitbuild``).

What one cache writes is resolved first (``target``), then its shards are planned, reused, run and
checked, and the manifest written last (``cacherun``).
"""

from __future__ import annotations

import os
from dataclasses import fields, replace

from ..errors import UsageError
from ..store.remote import secrets_hidden
from .cacherun import build_cache
from .config import BuildConfig, BuildResult, SplitsResult
from .findsource import detect_raw
from .sources.sourceoptions import SourceOptions
from .splitbuild import build_splits
from .splits import find_splits

__all__ = ["BuildConfig", "BuildResult", "SplitsResult", "build"]


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
            return build_cache(raw, out, config, detected=detected)
        return build_splits(raw, out, config, splits)
