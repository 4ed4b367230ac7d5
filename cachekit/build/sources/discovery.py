"""What a build reads from: the row of ``layouts.LAYOUTS`` that takes its RAW (a folder or URL of
images, Parquet files or WebDataset tars named by a pattern, a Python dataset or iterable, or a
kind added with ``layouts.register``), and the ``Source`` its module's ``discover`` makes.

Source modules sit below this one and never import it back.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from ...errors import UsageError
from ...store.remote import is_url
from ..annotate import add_arrays, add_masks
from ..config import BuildConfig
from ..guards import check_apart
from ..inputtable import Source, nonempty
from ..sourceoptions import with_keypoint_options
from .layouts import Request, detect, record_files_kind

__all__ = ["discover", "find_source", "record_files_kind"]


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
    request = Request(
        raw,
        annotations=config.annotations,
        labels=config.labels,
        storage_options=config.storage_options,
        masks=config.masks,
        arrays=config.arrays,
        mask_classes=mask_classes,
        config=config,
        out=out,
    )
    if request.text is None:
        _only_images(config, "a Python dataset")
    row = detect(request)
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
    source = discover(
        raw,
        config.labels,
        annotations=config.annotations,
        masks=config.masks,
        arrays=config.arrays,
        storage_options=config.storage_options,
        mask_classes=mask_classes,
    )
    return raw, _with_points(source, config)


def _with_points(source: Source, config: BuildConfig) -> Source:
    """``source`` with the keypoint options (``flip_idx=``, ``keypoint_names=``) in its keypoints field."""
    fields = with_keypoint_options(source.fields, config.source)
    return source if fields is source.fields else replace(source, fields=fields)


def discover(
    root: str | os.PathLike,
    labels_csv: str | os.PathLike | None = None,
    *,
    annotations: str | os.PathLike | None = None,
    masks: str | os.PathLike | None = None,
    arrays: dict | None = None,
    storage_options: dict | None = None,
    mask_classes: tuple[str, ...] | None = None,
) -> Source:
    """Find the inputs of ``root`` (a folder, or an fsspec URL reached with ``storage_options``):
    the first folder row of ``layouts.LAYOUTS`` that takes it makes its ``Source``.

    - ``annotations`` a COCO JSON file: the images it lists, with their boxes; ``"yolo"`` or a
      YOLO ``data.yaml``: the images under ``root/images/`` with their ``root/labels/`` files;
      ``"voc"``: Pascal VOC's ``root/Annotations/*.xml`` with ``root/JPEGImages/``.
    - ``labels_csv`` given: exactly the files it lists, with its labels (names or integers), and its
      ``labels`` (multi-label) and ``caption`` columns when it has them.
    - ``root/<class>/**/<image>``: ImageFolder; classes are the sorted sub-folder names, like
      torchvision's ImageFolder. Images directly in ``root`` are then ignored, and reported.
    - otherwise a flat folder: every image in ``root``, label -1.

    ``masks``: a folder with a class map per input (``a/b.jpg`` -> ``masks/a/b.png``); one folder
    of images (``RAW/images/``) is then no class, and the maps' class names are ``mask_classes``
    (else VOC's for VOC palette PNGs); ``arrays``:
    field name -> a folder with an array per input (``a/b.jpg`` -> ``folder/a/b.npy``).
    """
    if annotations is not None and labels_csv is not None:
        raise UsageError("--annotations and --labels both say which files are inputs: give one of them")
    request = Request(
        root,
        annotations=annotations,
        labels=labels_csv,
        storage_options=storage_options,
        masks=masks,
        arrays=arrays,
        mask_classes=mask_classes,
    )
    source = detect(request, folders_only=True).module().discover(request)
    if masks is not None:
        source = nonempty(add_masks(source, masks, storage_options, mask_classes))
    for name, folder in sorted((arrays or {}).items()):
        source = nonempty(add_arrays(source, name, folder, storage_options))
    return source
