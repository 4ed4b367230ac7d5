"""ImageFolder: ``RAW/<class>/**/<image>``, classes the sorted sub-folder names (those holding images),
like torchvision's ImageFolder; images directly in RAW are then ignored, and reported. A folder with
no such sub-folder is a flat folder (``flat``).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ...errors import UsageError
from .flat import flat_source
from .inputtable import (
    Source,
    Walk,
    is_dir,
    is_image_name,
    local_folder,
    nonempty,
    path_key,
    table,
    unread_extension,
    walk,
)
from .layouts import IMAGEFOLDER

__all__ = ["discover", "imagefolder_source"]


def imagefolder_source(root: Path) -> Source:
    """The images of a local folder ``root``: in ImageFolder layout when a sub-folder holds images,
    else a flat folder (``flat.flat_source``)."""
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
        return nonempty(table(root, IMAGEFOLDER.name, rows, classes, sorted(ignored), unread))
    return flat_source(root)


def discover(request) -> Source:
    """``base.SourceKind``: a local folder of images."""
    return imagefolder_source(local_folder(request.text))

