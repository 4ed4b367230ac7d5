"""The table of layouts: every kind of input a build reads, one row each, in the order discovery
tries them. Discovery (``discovery``), splits (``splits``), class names (``classnames``), ``bench``
(``tools/benchsamples``) and the build (``run``: the fast-decode guard, one class list for all
splits) read a layout's rules here, never its name.

A new source kind is one module with ``discover(request) -> Source`` (``base.SourceKind``) and one
row (``register``); nothing else changes. A row's ``detect`` sees the ``Request`` (the RAW and the
options naming files beside it) and says whether the row takes it; the first row that does wins.
A row whose ``detect`` is None is made by another row's module (a folder with no class sub-folder
is ``flat``, told by ``imagefolder``'s walk); ``objectstore`` lists a URL and names what it finds
``csv``, ``imagefolder`` or ``flat``, whose rows give its rules.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...store.remote import is_url

__all__ = [
    "Request",
    "Layout",
    "LAYOUTS",
    "register",
    "detect",
    "layout_named",
    "record_files_kind",
    "SORTED",
    "NUMBERED",
    "LISTED",
]

# Class-name rules (``Layout.class_names``).
#: Classes are names found in the data, sorted (ImageFolder's sub-folders); every split's, sorted.
SORTED = "sorted"
#: Classes are the numbers the targets use, when nothing names them (YOLO without names, tars, Parquet).
NUMBERED = "numbered"
#: Classes are names in the order the source lists them (a data.yaml, COCO's categories, a CSV's).
LISTED = "listed"

# Split rules (``Layout.splits``): each the module (under this package) whose ``find_splits`` finds them.
#: ``data.yaml``'s ``train``/``val``/``test`` (folders, lists, .txt files), else ``images/<split>/``.
YOLO_SPLITS = "yolosplits"
#: ``ImageSets/Main/<split>.txt`` lists of image ids.
VOC_SPLITS = "vocsplits"
#: Files named by split (``train-*.parquet``, ``data/val-*``, tars named by split).
FILE_SPLITS = "recordsplits"
#: Top-level ``train/`` ``val/`` ``test/`` folders, or files named by split in RAW or ``RAW/data``.
FOLDER_SPLITS = "foldersplits"

# How ``bench`` reads a layout's raw inputs again (``Layout.bench_raw``).
#: The files under RAW, found as a folder is.
BENCH_FILES = "files"
#: The files under RAW with the annotations the manifest names.
BENCH_ANNOTATIONS = "annotations"
#: The files of records, read as the build read them (its columns, its box format).
BENCH_RECORDS = "records"
#: The user's Python object, given to ``bench`` again.
BENCH_OBJECT = "object"


@dataclass(frozen=True)
class Request:
    """What a build was asked to read: ``raw`` (a path, URL or file pattern, or the user's dataset or
    iterable) and the options that name files beside it. ``config`` is the build's ``BuildConfig``
    (None when only a folder is discovered); ``out`` the build's output (checked apart from RAW)."""

    raw: object
    annotations: str | os.PathLike | None = None
    labels: str | os.PathLike | None = None
    storage_options: dict | None = None
    masks: str | os.PathLike | None = None
    arrays: dict | None = None
    mask_classes: tuple[str, ...] | None = None
    config: object | None = None
    out: object | None = None

    @property
    def text(self) -> str | None:
        """RAW as text when it is a path, URL or pattern; None for a Python object."""
        return os.fspath(self.raw) if isinstance(self.raw, (str, os.PathLike)) else None

    @property
    def local_dir(self) -> bool:
        """RAW is a folder on this machine."""
        text = self.text
        return text is not None and not is_url(text) and Path(text).is_dir()


@dataclass(frozen=True)
class Layout:
    """One row: a layout (the manifest's ``source.layout``) and every rule that depends on it."""

    name: str
    #: How discovery recognises it, in words (docs and ``cachekit build --help`` speak of this).
    detected_by: str
    #: Whether a request is of this layout (rows are tried in order); None: made by another row.
    detect: Callable[[Request], bool] | None
    #: The module that makes its ``Source``: a module name (under ``cachekit.build.sources`` when it
    #: has no dot) or any object with ``discover(request)`` (``base.SourceKind``).
    source: object
    #: How its splits are found: a module name (under ``cachekit.build.sources`` when it has no dot)
    #: or any object with ``find_splits(request, row)``; None when it names none.
    splits: object | None
    #: How its classes are named when nothing else names them (SORTED, NUMBERED, LISTED).
    class_names: str
    #: How ``bench`` reads its raw inputs again (``BENCH_*``); None: it cannot.
    bench_raw: str | None
    #: Whether ``--fast-decode`` may be used: False when its targets are in the full image's pixels.
    fast_decode: bool
    #: The ``--annotations`` value that names it (``yolo``, ``voc``), if one does.
    annotations: str | None = None
    #: The file suffix that names files of it (``.parquet``, ``.tar``), if it is read from files of records.
    suffix: str | None = None
    #: Whether it is a folder of images (``discovery.discover`` tries only these rows).
    folder: bool = True
    #: What its files are called in messages (``Parquet``, ``tar``), when it is read from files of records.
    files_noun: str | None = None

    def module(self):
        """The object whose ``discover(request)`` makes this layout's ``Source``."""
        return _resolve(self.source)

    def split_finder(self):
        """The object whose ``find_splits(request, row)`` finds this layout's splits; None: it names none."""
        return _resolve(self.splits) if self.splits is not None else None


def _resolve(where: object):
    """A module named by ``where`` (under this package when it has no dot), or ``where`` itself."""
    if isinstance(where, str):
        return importlib.import_module(where if "." in where else f"{__package__}.{where}")
    return where


def _records(suffix: str) -> Callable[[Request], bool]:
    def detect(request: Request) -> bool:
        return request.text is not None and request.text.lower().endswith(suffix) and not request.local_dir

    return detect


def _annotations(request: Request) -> str | None:
    return None if request.annotations is None else str(request.annotations)


def _is_voc(request: Request) -> bool:
    return _annotations(request) == VOC.annotations


def _is_yolo(request: Request) -> bool:
    given = _annotations(request)
    return given is not None and (given == YOLO.annotations or given.lower().endswith((".yaml", ".yml")))


def _is_dataset(request: Request) -> bool:
    return request.text is None and hasattr(request.raw, "__len__") and hasattr(request.raw, "__getitem__")


def _is_iterable(request: Request) -> bool:
    return request.text is None and hasattr(request.raw, "__iter__")


PARQUET = Layout(
    "parquet", "RAW names .parquet files (a path, glob or brace pattern)", _records(".parquet"), "parquet",
    FILE_SPLITS, NUMBERED, BENCH_RECORDS, False, suffix=".parquet", folder=False, files_noun="Parquet",
)  # fmt: skip
WEBDATASET = Layout(
    "webdataset", "RAW names .tar files (WebDataset shards)", _records(".tar"), "webdataset",
    FILE_SPLITS, NUMBERED, BENCH_RECORDS, False, suffix=".tar", folder=False, files_noun="tar",
)  # fmt: skip
DATASET = Layout(
    "dataset", "a Python object with __len__ and __getitem__ (map-style dataset)", _is_dataset, "pydataset",
    None, LISTED, BENCH_OBJECT, False, folder=False,
)  # fmt: skip
STREAM = Layout(
    "stream", "a Python object with __iter__ only (an iterable, read once in order)", _is_iterable, "iterable",
    None, LISTED, None, False, folder=False,
)  # fmt: skip
VOC = Layout(
    "voc", "--annotations voc: RAW/Annotations/*.xml with RAW/JPEGImages/", _is_voc, "voc",
    VOC_SPLITS, LISTED, BENCH_FILES, False, annotations="voc",
)  # fmt: skip
YOLO = Layout(
    "yolo", "--annotations yolo or a data.yaml: RAW/images/ with RAW/labels/", _is_yolo, "yolo",
    YOLO_SPLITS, NUMBERED, BENCH_ANNOTATIONS, True, annotations="yolo",
)  # fmt: skip
COCO = Layout(
    "coco", "--annotations a COCO instances JSON file", lambda r: r.annotations is not None, "coco",
    None, LISTED, BENCH_ANNOTATIONS, False,
)  # fmt: skip
OBJECTSTORE = Layout(
    "objectstore", "RAW an fsspec URL (s3://, gs://, ...): one listing, made a csv, imagefolder or flat source",
    lambda r: r.text is not None and is_url(r.text), "objectstore", None, LISTED, None, True,
)  # fmt: skip
CSV = Layout(
    "csv", "--labels a CSV of file,label rows", lambda r: r.labels is not None, "labelscsv",
    None, LISTED, BENCH_FILES, True,
)  # fmt: skip
IMAGEFOLDER = Layout(
    "imagefolder", "a folder (or URL) with sub-folders of images: one class each", lambda r: r.text is not None,
    "imagefolder", FOLDER_SPLITS, SORTED, BENCH_FILES, True,
)  # fmt: skip
FLAT = Layout(
    "flat", "a folder with no class sub-folder (told by imagefolder's walk): every image, no class", None,
    "flat", FOLDER_SPLITS, SORTED, BENCH_FILES, True,
)  # fmt: skip

#: Every layout, in the order discovery tries them.
LAYOUTS: list[Layout] = [PARQUET, WEBDATASET, DATASET, STREAM, VOC, YOLO, COCO, OBJECTSTORE, CSV, IMAGEFOLDER, FLAT]


def register(layout: Layout, before: str = IMAGEFOLDER.name) -> Layout:
    """Add ``layout`` to the table, tried just before the row named ``before`` (by default before
    ImageFolder, which takes any folder); a name already in the table is an error."""
    if layout_named(layout.name) is not None:
        raise ValueError(f"a layout named {layout.name!r} is already in the table")
    at = next(i for i, row in enumerate(LAYOUTS) if row.name == before)
    LAYOUTS.insert(at, layout)
    return layout


def unregister(name: str) -> None:
    """Remove the row named ``name`` (a layout added by ``register``)."""
    LAYOUTS[:] = [row for row in LAYOUTS if row.name != name]


def detect(request: Request, *, folders_only: bool = False) -> Layout | None:
    """The first row whose ``detect`` takes ``request`` (only folder rows when ``folders_only``)."""
    for row in LAYOUTS:
        if row.detect is not None and (row.folder or not folders_only) and row.detect(request):
            return row
    return None


def layout_named(name: object) -> Layout | None:
    """The row of the layout a ``Source`` or a manifest names; None for one the table lacks."""
    return next((row for row in LAYOUTS if row.name == name), None)


def record_files_kind(text: str) -> str | None:
    """``"parquet"`` or ``"tar"`` when ``text`` names files of records (a path, a glob or a brace
    pattern): the suffix, without its dot, of the row that reads them."""
    for row in LAYOUTS:
        if row.suffix is not None and text.lower().endswith(row.suffix):
            return row.suffix[1:]
    return None


def record_suffixes() -> tuple[str, ...]:
    """The suffixes of files of records, in the table's order."""
    return tuple(row.suffix for row in LAYOUTS if row.suffix is not None)
