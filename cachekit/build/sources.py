"""Discovering a build's inputs: which reader a RAW and its options call for (a folder in ImageFolder
layout, a flat folder, a labels CSV, COCO/YOLO annotations, a folder on object storage), with masks
and arrays added to any of them.

The readers of each layout sit below this module (``inputtable`` below them all) and never call
back into it.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ..errors import UsageError
from ..store.remote import is_url
from .annotate import add_arrays, add_masks, coco_source, yolo_source
from .inputtable import (
    Source,
    Walk,
    file_problem,
    is_dir,
    is_image_name,
    nonempty,
    path_key,
    stat_problem,
    table,
    unread_extension,
    walk,
)
from .labels import read_labels_csv
from .remotesource import discover_remote
from .voc import voc_source

__all__ = ["Source", "discover"]


def _csv_source(root: Path, labels_csv: Path) -> Source:
    labels = read_labels_csv(root, labels_csv)
    rows, ignored = [], []
    for rel, label in labels.pairs:
        try:
            st = (root / rel).stat()
        except OSError as exc:
            ignored.append((rel, stat_problem(exc)))
            continue
        problem = file_problem(st)
        if problem is not None:
            ignored.append((rel, problem))
        else:
            rows.append((rel, label, st.st_size, st.st_mtime_ns))
    return labels.attach(table(root, "csv", rows, labels.classes, ignored, {}))


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
    """Find the inputs of ``root`` (a folder, or an fsspec URL reached with ``storage_options``).

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
    source = _discover(root, labels_csv, annotations, storage_options)
    if masks is not None:
        source = nonempty(add_masks(source, masks, storage_options, mask_classes))
    for name, folder in sorted((arrays or {}).items()):
        source = nonempty(add_arrays(source, name, folder, storage_options))
    return source


def _discover(root, labels_csv, annotations, storage_options) -> Source:
    if annotations is not None:
        if labels_csv is not None:
            raise UsageError("--annotations and --labels both say which files are inputs: give one of them")
        text = str(annotations)
        if text == "voc":
            return nonempty(voc_source(root, storage_options))
        if text == "yolo" or text.lower().endswith((".yaml", ".yml")):
            return nonempty(yolo_source(root, text, storage_options))
        return nonempty(coco_source(root, annotations, storage_options))
    if is_url(root):
        return discover_remote(str(root), labels_csv, storage_options)
    root = Path(root)
    if not root.exists():
        raise UsageError(f"{root} does not exist")
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder")
    if labels_csv is not None:
        return nonempty(_csv_source(root, Path(labels_csv)))
    try:
        top = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"{root} cannot be listed: {exc.strerror}") from None
    subdirs = [e.name for e in top if not e.name.startswith(".") and is_dir(e)]
    per_class, visited = {}, {(st.st_dev, st.st_ino) for st in [root.stat()]}
    for d in subdirs:
        found = Walk(visited=visited)  # shared: a real folder belongs to one class only
        walk(root, d, found)
        per_class[d] = found
    classes = [d for d in subdirs if per_class[d].files]
    ignored: list[tuple[str, str]] = []
    unread: Counter = Counter()
    for found in per_class.values():
        ignored += found.ignored
        unread += found.unread
    if classes:
        rows = [
            (rel, label, size, mtime)
            for label, c in enumerate(classes)
            for rel, size, mtime in per_class[c].files
        ]
        ignored += [
            (e.name, "outside any class folder") for e in top if not is_dir(e) and is_image_name(e.name)
        ]
        unread += Counter(ext for e in top if not is_dir(e) and (ext := unread_extension(e.name)))
        rows.sort(key=lambda r: path_key(r[0]))
        return nonempty(table(root, "imagefolder", rows, classes, sorted(ignored), unread))
    found = Walk()
    walk(root, "", found)
    rows = sorted(((rel, -1, size, mtime) for rel, size, mtime in found.files), key=lambda r: path_key(r[0]))
    return nonempty(table(root, "flat", rows, (), sorted(found.ignored), found.unread))
