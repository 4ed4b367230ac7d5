"""A labels CSV (``--labels``): ``file,label`` rows, or a header naming ``label``, ``labels`` (several
classes, ``;``-separated: multi-label samples) and ``caption`` (a text) columns; read as data from a
regular UTF-8 file of bounded size.

A FIFO would block the read, a device would never end, a binary file is not text: each is one
line saying so (exit 2), before any input is listed.
"""

from __future__ import annotations

import csv
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ...store.fields import FieldSpec
from ...store.limits import MAX_CLASSES
from .inputtable import Source, file_problem, local_folder, nonempty, path_key, stat_problem, table
from .layouts import CSV

__all__ = ["discover", "csv_source", "read_labels_csv", "read_text_file", "LabelsTable"]


#: Largest labels CSV read (ImageNet's 1.28M rows are ~50 MB).
_MAX_LABELS_BYTES = 1 << 30


def _labels_text(labels_csv: Path) -> str:
    """The text of a labels CSV: a regular file (never a FIFO, which would block), UTF-8, bounded."""
    return read_text_file(labels_csv, "labels file", _MAX_LABELS_BYTES, "a CSV of file,label")


def read_text_file(path: Path, what: str, max_bytes: int, expected: str = "text") -> str:
    """The text of a small file a user names (a labels CSV, a data.yaml): a regular file (never a
    FIFO, which would block, nor a device, which never ends), UTF-8, at most ``max_bytes``; else one
    line (UsageError) naming it as ``what`` and saying it should be ``expected``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{what} {path} is a folder, not {expected}")
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path} is not a regular file (a FIFO, a device, a socket?)")
        if st.st_size > max_bytes:
            raise UsageError(f"{what} {path} is {st.st_size} bytes, over the {max_bytes} it may have")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {exc.start}); expected {expected}") from None
    if "\0" in text:
        raise UsageError(f"{what} {path} holds NUL bytes: not {expected}")
    return text


#: Header names of a labels CSV's path column, and the columns it may have besides.
_PATH_HEADERS = ("file", "path", "filename", "image")
_COLUMNS = ("label", "labels", "caption")


@dataclass
class LabelsTable:
    """A labels CSV, read: each listed path's class, and its classes and caption when it has them."""

    pairs: list[tuple[str, int]]
    classes: list[str]
    multi: dict[str, list[int]] | None  # a ``labels`` column: several classes per path
    captions: dict[str, str] | None  # a ``caption`` column
    has_label: bool

    def attach(self, source):
        """``source`` (a ``Source`` of the listed files that exist) with the CSV's fields."""
        fields, parts = {}, []
        if self.multi is not None:
            fields["labels"], parts = FieldSpec("labels"), [*parts, "labels"]
        if self.captions is not None:
            fields["text"], parts = FieldSpec("text"), [*parts, "text"]
        if not fields:
            return source
        if self.has_label:
            fields = {"label": FieldSpec("label"), **fields}
        values = {"labels": self.multi, "text": self.captions}
        targets = [{k: values[k][p] for k in parts} for p in source.paths]
        return source.with_targets(fields, targets, (), source.extra)


def _header(labels_csv: Path, rows: list[list[str]]) -> dict[str, int]:
    """Column name -> index; without a header row, ``file,label``."""
    first = [c.strip().lower() for c in rows[0]] if rows else []
    if not first or first[0] not in _PATH_HEADERS:
        return {"label": 1}
    unknown = [c for c in first[1:] if c and c not in _COLUMNS]
    if unknown or len(set(first)) != len(first):
        raise UsageError(
            f"{labels_csv}: header {rows[0]!r}: columns after the path may be {', '.join(_COLUMNS)}, each once"
        )
    return {c: i for i, c in enumerate(first) if i and c}


def _class_index(tokens: set[str]) -> tuple[list[str], dict[str, int]]:
    """Class names and each token's index: integers stand for themselves, names are sorted."""
    tokens = {t for t in tokens if t not in ("", "-1")}
    if all(t.isdigit() for t in tokens):
        top = max((int(t) for t in tokens), default=-1)
        if top >= MAX_CLASSES:
            raise UsageError(f"class {top} is past the {MAX_CLASSES} classes a cache may name")
        return [str(i) for i in range(top + 1)], {t: int(t) for t in tokens} | {"-1": -1, "": -1}
    classes = sorted(tokens)
    return classes, {c: i for i, c in enumerate(classes)} | {"-1": -1, "": -1}


def read_labels_csv(root, labels_csv: Path) -> LabelsTable:
    """The rows of a labels CSV, sorted by path, with their classes (and multi-labels, captions)."""
    text = _labels_text(labels_csv)
    try:
        rows = [r for r in csv.reader(io.StringIO(text, newline="")) if r and any(c.strip() for c in r)]
    except csv.Error as exc:
        raise UsageError(f"{labels_csv}: not a CSV of file,label ({exc})") from None
    columns = _header(labels_csv, rows)
    body = rows[1:] if rows and rows[0][0].strip().lower() in _PATH_HEADERS else rows
    width = max(columns.values(), default=0) + 1
    entries: dict[str, list[str]] = {}
    for n, row in enumerate(body, 1):
        if len(row) < width or not row[0].strip():
            raise UsageError(
                f"{labels_csv}: row {n} does not have the {width} columns of its header: {row!r}"
                if columns != {"label": 1}
                else f"{labels_csv}: row {n} is not 'file,label': {row!r}"
            )
        rel = Path(row[0].strip()).as_posix()
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise UsageError(f"{labels_csv}: row {n}: {rel!r} must be a path inside {root}")
        cells = [row[columns[c]].strip() if c in columns else "" for c in _COLUMNS]
        if entries.setdefault(rel, cells) != cells:
            raise UsageError(f"{labels_csv}: {rel!r} is listed twice, with other values")
    if not entries:
        raise UsageError(f"{labels_csv}: no rows")
    names = sorted(entries, key=path_key)
    label_tokens = {entries[p][0] for p in names}
    multi_tokens = {t.strip() for p in names for t in entries[p][1].split(";") if t.strip()}
    if any(t.lstrip("-").isdigit() and int(t) < -1 for t in label_tokens if t):
        raise UsageError(f"{labels_csv}: integer labels must be >= -1")
    try:
        classes, index = _class_index(label_tokens | multi_tokens)
    except UsageError as exc:
        raise UsageError(f"{labels_csv}: {exc}") from None
    pairs = [(p, index[entries[p][0]]) for p in names]
    multi = None
    if "labels" in columns:
        multi = {p: sorted({index[t.strip()] for t in entries[p][1].split(";") if t.strip()}) for p in names}
    captions = {p: entries[p][2] for p in names} if "caption" in columns else None
    return LabelsTable(pairs, classes, multi, captions, "label" in columns)


def csv_source(root: Path, labels_csv: Path) -> Source:
    """Exactly the files a labels CSV lists under ``root``, with its labels (and multi-labels, captions)."""
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
    return labels.attach(table(root, CSV.name, rows, labels.classes, ignored, {}))


def discover(request) -> Source:
    """``base.SourceKind``: a local folder with ``--labels`` (a URL's is ``objectstore``'s)."""
    return nonempty(csv_source(local_folder(request.text), Path(request.labels)))
