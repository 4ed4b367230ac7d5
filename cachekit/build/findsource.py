"""What a build reads from: its ``Request`` (RAW and the options naming files beside it), the row of
``sources.layouts`` that takes it, detected once and passed along (to ``splits`` and to discovery),
and the ``Source`` that row's module makes, checked against the build's options.

The source modules under ``sources/`` sit below this one and never import it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import UsageError
from ..store.remote import is_url
from .config import BuildConfig
from .guards import check_apart
from .sources.discovery import folder_source
from .sources.inputtable import Source
from .sources.layouts import Layout, Request, detect
from .sources.sourceoptions import with_keypoint_options

__all__ = ["Detected", "detect_raw", "find_source"]


@dataclass(frozen=True)
class Detected:
    """A build's RAW as a ``Request`` and the row of ``layouts.LAYOUTS`` that takes it (None: none does)."""

    request: Request
    row: Layout | None


def detect_raw(raw, out, config: BuildConfig) -> Detected:
    """The layout of ``raw`` built into ``out`` with ``config``: the first row that takes it."""
    request = Request(
        raw,
        annotations=config.annotations,
        labels=config.labels,
        storage_options=config.storage_options,
        masks=config.masks,
        arrays=config.arrays,
        config=config,
        out=out,
    )
    return Detected(request, detect(request))


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
    raw,
    out,
    config: BuildConfig,
    *,
    mask_classes: tuple[str, ...] | None = None,
    detected: Detected | None = None,
) -> tuple[Path | str, Source]:
    """The build's RAW as the manifest names it, and its ``Source`` (``mask_classes``: the names
    of ``--masks``' class values, read from ``--mask-classes``; ``detected``: RAW's layout, when the
    build detected it already)."""
    detected = detected if detected is not None else detect_raw(raw, out, config)
    request, row = replace(detected.request, mask_classes=mask_classes), detected.row
    if request.text is None:
        _only_images(config, "a Python dataset")
    if row is None:
        raise UsageError(
            f"cannot build from a {type(raw).__name__}: give a folder, a URL, Parquet or tar files, a dataset "
            "(__len__ and __getitem__) or an iterable of samples"
        )
    if not row.folder:
        if request.text is not None:
            what = f"a {row.suffix[1:].title()} source" if row.suffix else f"a {row.name} source"
            _only_images(config, what)
            if config.source.fields is not None:
                raise UsageError(
                    f"fields= declares the fields of samples from code; {what}'s come from its columns and members"
                )
        source = _with_points(row.module().discover(request), config)
        return (request.text if request.text is not None else source.root), source
    text = request.text
    raw = text if is_url(text) else Path(text)
    if config.source.max_samples is not None:
        raise UsageError(
            "--max-samples takes the first samples of Parquet files, tars, a dataset or an iterable; "
            "a folder's inputs are its files"
        )
    check_apart(raw, out)
    folder = replace(request, raw=raw, config=None, out=None)  # as discovery.discover makes it
    return raw, _with_points(folder_source(folder, row), config)


def _with_points(source: Source, config: BuildConfig) -> Source:
    """``source`` with the keypoint options (``flip_idx=``, ``keypoint_names=``) in its keypoints field."""
    fields = with_keypoint_options(source.fields, config.source)
    return source if fields is source.fields else replace(source, fields=fields)
