"""A labels CSV (``--labels``): ``file,label`` rows, read as data from a regular UTF-8 file of bounded size.

A FIFO would block the read, a device would never end, a binary file is not text: each is one
line saying so (exit 2), before any input is listed.
"""

from __future__ import annotations

import csv
import io
import os
import stat
from pathlib import Path

from ..errors import UsageError

__all__ = ["read_labels_csv"]


#: Largest labels CSV read (ImageNet's 1.28M rows are ~50 MB).
_MAX_LABELS_BYTES = 1 << 30


def _labels_text(labels_csv: Path) -> str:
    """The text of a labels CSV: a regular file (never a FIFO, which would block), UTF-8, bounded."""
    try:
        fd = os.open(labels_csv, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"labels file {labels_csv} does not exist") from None
    except OSError as exc:
        raise UsageError(f"labels file {labels_csv} cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"labels file {labels_csv} is a folder, not a CSV file")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"labels file {labels_csv} is not a regular file (a FIFO, a device, a socket?)")
        if st.st_size > _MAX_LABELS_BYTES:
            raise UsageError(
                f"labels file {labels_csv} is {st.st_size} bytes, over the {_MAX_LABELS_BYTES} a labels CSV may have"
            )
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(_MAX_LABELS_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"labels file {labels_csv} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"labels file {labels_csv} is not UTF-8 text (byte {exc.start}); expected a CSV of file,label"
        ) from None
    if "\0" in text:
        raise UsageError(f"labels file {labels_csv} holds NUL bytes: not a CSV of file,label")
    return text


def read_labels_csv(root, labels_csv: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """``(path, label)`` rows of a labels CSV, sorted by path, and the class names."""
    text = _labels_text(labels_csv)
    try:
        rows = [r for r in csv.reader(io.StringIO(text, newline="")) if r and any(c.strip() for c in r)]
    except csv.Error as exc:
        raise UsageError(f"{labels_csv}: not a CSV of file,label ({exc})") from None
    if rows and rows[0][0].strip().lower() in ("file", "path", "filename", "image"):
        rows = rows[1:]
    pairs = []
    for n, row in enumerate(rows, 1):
        if len(row) < 2 or not row[0].strip():
            raise UsageError(f"{labels_csv}: row {n} is not 'file,label': {row!r}")
        rel = Path(row[0].strip()).as_posix()
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise UsageError(f"{labels_csv}: row {n}: {rel!r} must be a path inside {root}")
        pairs.append((rel, row[1].strip()))
    if not pairs:
        raise UsageError(f"{labels_csv}: no rows")
    seen: dict[str, str] = {}
    for rel, label in pairs:
        if seen.setdefault(rel, label) != label:
            raise UsageError(f"{labels_csv}: {rel!r} is listed with two labels")
    from .sources import path_key  # the one order of paths (sources imports this module)

    names = sorted(seen, key=path_key)
    values = [seen[p] for p in names]
    if all(v.lstrip("-").isdigit() for v in values):
        ints = [int(v) for v in values]
        if min(ints) < -1:
            raise UsageError(f"{labels_csv}: integer labels must be >= -1")
        return list(zip(names, ints)), [str(i) for i in range(max(ints) + 1)]
    classes = sorted(set(values))
    index = {c: i for i, c in enumerate(classes)}
    return [(p, index[v]) for p, v in zip(names, values)], classes
