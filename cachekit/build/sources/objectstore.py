"""Discovering the inputs of a raw folder on object storage: one paged listing (``listing``), kept as
compact arrays, and the same layouts as a local folder (labels CSV, ImageFolder, flat)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import numpy as np

from ...errors import UsageError
from ...store.remote import access_error, filesystem, reach
from .inputtable import Source, is_image_name, nonempty, unread_extension
from .labelscsv import read_labels_csv
from .layouts import CSV, FLAT, IMAGEFOLDER
from .listing import Listing, list_files

__all__ = ["discover", "discover_remote", "remote_files"]


def _listing(url: str, storage_options: dict | None) -> Listing:
    """Every file below ``url`` (hidden ones left out), listed a page at a time (``listing``)."""
    fs, base = filesystem(url, storage_options)
    reach(fs, base, url)
    try:
        found = list_files(fs, base)
    except FileNotFoundError:
        found = None
    except Exception as exc:  # credentials, endpoint, I/O: one line
        raise access_error(url, exc, UsageError, "list") from None
    if found is None or len(found) == 0:
        raise UsageError(f"{url} does not exist or holds no files")
    return found


def remote_files(url: str, storage_options: dict | None) -> dict[str, tuple[int, int]]:
    """Every file below ``url``: relative path -> (size, stamp), for annotation sources' lookups."""
    found = _listing(url, storage_options)
    return dict(zip(found.paths, zip(found.sizes.tolist(), found.stamps.tolist())))


def discover_remote(url: str, labels_csv: str | os.PathLike | None, storage_options: dict | None) -> Source:
    """``discover`` for a folder on object storage (an fsspec URL): a paged listing (``listing``), same layouts."""
    found = _listing(url, storage_options)
    paths = found.paths
    image = np.zeros(len(paths), dtype=bool)
    nested = np.zeros(len(paths), dtype=bool)
    unread: Counter = Counter()
    tops: dict[str, int] = {}
    top_of = np.full(len(paths), -1, dtype=np.int64)
    for i, rel in enumerate(paths):  # one pass, nothing kept per file but these arrays
        if is_image_name(rel):
            image[i] = True
            if "/" in rel:
                nested[i] = True
                top_of[i] = tops.setdefault(rel.split("/", 1)[0], len(tops))
        elif (ext := unread_extension(rel)) is not None:
            unread[ext] += 1

    def source(layout: str, rows: np.ndarray, labels: np.ndarray, classes, ignored) -> Source:
        return nonempty(
            Source(
                root=url,
                layout=layout,
                paths=paths.take(rows),
                labels=np.asarray(labels, dtype=np.int64),
                sizes=found.sizes[rows],
                mtimes=found.stamps[rows],
                classes=tuple(classes),
                ignored=tuple(ignored),
                unread=dict(sorted(unread.items())) if layout != CSV.name else {},
            )
        )

    if labels_csv is not None:
        table_ = read_labels_csv(url, Path(labels_csv))
        pairs, classes = table_.pairs, table_.classes
        wanted = {p: k for k, (p, _) in enumerate(pairs)}
        at = np.full(len(pairs), -1, dtype=np.int64)
        for i, rel in enumerate(paths):
            k = wanted.get(rel)
            if k is not None:
                at[k] = i
        keep = np.flatnonzero(at >= 0)
        labels = [pairs[k][1] for k in keep.tolist()]
        ignored = [(pairs[k][0], "unreadable: not found") for k in np.flatnonzero(at < 0).tolist()]
        return nonempty(table_.attach(source(CSV.name, at[keep], labels, classes, ignored)))
    if nested.any():
        names = sorted(tops)
        rank = np.empty(len(tops), dtype=np.int64)
        for label, name in enumerate(names):
            rank[tops[name]] = label
        rows = np.flatnonzero(nested)
        ignored = [(paths[i], "outside any class folder") for i in np.flatnonzero(image & ~nested).tolist()]
        return source(IMAGEFOLDER.name, rows, rank[top_of[rows]], names, ignored)
    rows = np.flatnonzero(image)
    return source(FLAT.name, rows, np.full(len(rows), -1), (), ())


def discover(request) -> Source:
    """``base.SourceKind``: a folder on object storage, with ``--labels`` or as a folder of images."""
    return discover_remote(request.text, request.labels, request.storage_options)
