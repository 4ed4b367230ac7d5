"""A folder's inputs (``discover``): the first folder row of ``layouts.LAYOUTS`` that takes RAW (a
local folder or a URL), its module's ``discover``, masks and arrays added (``annotate``).

What a whole build reads from (a folder, files of records, a Python object) is ``build.findsource``,
above this package; the source modules never import this one back.
"""

from __future__ import annotations

import os

from ...errors import UsageError
from .annotate import add_arrays, add_masks
from .inputtable import Source, nonempty
from .layouts import Layout, Request, detect, record_files_kind

__all__ = ["discover", "folder_source", "record_files_kind"]


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
    request = Request(
        root,
        annotations=annotations,
        labels=labels_csv,
        storage_options=storage_options,
        masks=masks,
        arrays=arrays,
        mask_classes=mask_classes,
    )
    return folder_source(request, detect(request, folders_only=True))


def folder_source(request: Request, row: Layout) -> Source:
    """The ``Source`` of a folder ``request`` whose row is known (``detect`` ran once, by the caller):
    its module's ``discover``, then ``request.masks`` and ``request.arrays`` added."""
    if request.annotations is not None and request.labels is not None:
        raise UsageError("--annotations and --labels both say which files are inputs: give one of them")
    source = row.module().discover(request)
    if request.masks is not None:
        source = nonempty(add_masks(source, request.masks, request.storage_options, request.mask_classes))
    for name, folder in sorted((request.arrays or {}).items()):
        source = nonempty(add_arrays(source, name, folder, request.storage_options))
    return source
