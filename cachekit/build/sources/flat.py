"""A flat folder: every image under RAW (any depth), no class (label -1)."""

from __future__ import annotations

from pathlib import Path

from .inputtable import Source, Walk, local_folder, nonempty, path_key, table, walk
from .layouts import FLAT

__all__ = ["discover", "flat_source"]


def flat_source(root: Path) -> Source:
    """Every image under ``root``, sorted by path, unlabelled."""
    found = Walk()
    walk(root, "", found)
    rows = sorted(((rel, -1, size, mtime) for rel, size, mtime in found.files), key=lambda r: path_key(r[0]))
    return nonempty(table(root, FLAT.name, rows, (), sorted(found.ignored), found.unread))


def discover(request) -> Source:
    """``base.SourceKind``: every image of a local folder, no class (``imagefolder`` chooses it)."""
    return flat_source(local_folder(request.text))
