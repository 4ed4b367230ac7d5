"""What a build reads from: a folder or URL of images (``sources.discover``), Parquet files or
WebDataset tars named by a pattern, or a Python dataset or iterable; one ``Source`` for each."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from ..store.remote import is_url
from .config import BuildConfig
from .guards import check_apart
from .inputtable import Source
from .pysource import dataset_source
from .sources import discover

__all__ = ["find_source", "record_files_kind"]

#: File suffixes read as files of records, and the kind of each.
_RECORD_SUFFIXES = {".parquet": "parquet", ".tar": "tar"}


def record_files_kind(text: str) -> str | None:
    """``"parquet"`` or ``"tar"`` when ``text`` names such files (a path, a glob or a brace pattern)."""
    for suffix, kind in _RECORD_SUFFIXES.items():
        if text.lower().endswith(suffix):
            return kind
    return None


def _only_images(config: BuildConfig, what: str) -> None:
    given = [
        flag
        for flag, value in (
            ("--labels", config.labels),
            ("--annotations", config.annotations),
            ("--masks", config.masks),
            ("--array", config.arrays),
        )
        if value
    ]
    if given:
        raise UsageError(
            f"{' and '.join(given)} name files beside a folder of images; {what} carries its own targets"
        )


def find_source(
    raw, out, config: BuildConfig, *, mask_classes: tuple[str, ...] | None = None
) -> tuple[Path | str, Source]:
    """The build's RAW as the manifest names it, and its ``Source`` (``mask_classes``: the names
    of ``--masks``' class values, read from ``--mask-classes``)."""
    if isinstance(raw, (str, os.PathLike)):
        text = os.fspath(raw)
        kind = record_files_kind(text)
        if kind is not None and not (not is_url(text) and Path(text).is_dir()):
            _only_images(config, f"a {kind.title()} source")
            if config.source.fields is not None:
                raise UsageError(
                    f"fields= declares the fields of samples from code; a {kind.title()} source's come "
                    "from its columns and members"
                )
            if kind == "parquet":
                from .parquetsource import parquet_source

                return text, parquet_source(text, config.source, config.storage_options)
            from .tarsource import tar_source

            return text, tar_source(text, config.source, config.storage_options)
        raw = text if is_url(text) else Path(text)
        if config.source.max_samples is not None:
            raise UsageError(
                "--max-samples takes the first samples of Parquet files, tars, a dataset or an iterable; "
                "a folder's inputs are its files"
            )
        check_apart(raw, out)
        source = discover(
            raw,
            config.labels,
            annotations=config.annotations,
            masks=config.masks,
            arrays=config.arrays,
            storage_options=config.storage_options,
            mask_classes=mask_classes,
        )
        return raw, source
    _only_images(config, "a Python dataset")
    options = config.source
    if hasattr(raw, "__len__") and hasattr(raw, "__getitem__"):
        source = dataset_source(
            raw,
            options.samples(),
            classes=options.classes,
            source_id=options.source_id,
            fields=options.fields,
            max_samples=options.limit(),
        )
        return source.root, source
    if hasattr(raw, "__iter__"):
        from .itersource import iterable_source

        source = iterable_source(
            raw,
            options.samples(),
            classes=options.classes,
            source_id=options.source_id,
            fields=options.fields,
            max_samples=options.limit(),
        )
        return source.root, source
    raise UsageError(
        f"cannot build from a {type(raw).__name__}: give a folder, a URL, Parquet or tar files, a dataset "
        "(__len__ and __getitem__) or an iterable of samples"
    )
