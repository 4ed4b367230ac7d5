"""Discovering raw datasets: ImageFolder layout, a flat folder, or a labels CSV; stable sorted order."""

from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from ..constants import IMAGE_EXTENSIONS
from ..errors import UsageError
from ..store.remote import filesystem, is_url

__all__ = ["Source", "discover", "inputs_digest", "is_image_name", "path_key"]


def path_key(path: str) -> tuple[str, ...]:
    """Sort key of a relative POSIX path: folder by folder, so ``a/x`` sorts before ``a-b/x``."""
    return tuple(path.split("/"))


def is_image_name(name: str) -> bool:
    """True for file names with a recognised image extension, in any case."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


@dataclass(frozen=True)
class Source:
    """The inputs of a build, in their stable order.

    ``paths`` are POSIX paths relative to ``root``; the numeric columns are numpy arrays. Shard jobs
    receive only their own slice of the table.
    """

    root: Path | str  # a folder, or an fsspec URL
    layout: str  # "imagefolder" | "flat" | "csv"
    paths: tuple[str, ...]
    labels: np.ndarray  # int64, -1 when unlabelled
    sizes: np.ndarray  # int64 bytes (-1 when stat failed)
    mtimes: np.ndarray  # int64 ns
    classes: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...] = ()  # (path, reason) found but not usable as inputs

    def __len__(self) -> int:
        return len(self.paths)

    def digest(self, start: int = 0, stop: int | None = None) -> str:
        """sha256 over (path, size, mtime, label) of inputs[start:stop]: changes iff those inputs do."""
        return inputs_digest(self, start, len(self) if stop is None else stop)


def inputs_digest(source: Source, start: int, stop: int) -> str:
    h = hashlib.sha256()
    for i in range(start, stop):
        h.update(f"{source.paths[i]}\0{source.sizes[i]}\0{source.mtimes[i]}\0{source.labels[i]}\n".encode())
    return h.hexdigest()


def _stat(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        try:
            st = path.lstat()
        except OSError:
            return -1, -1
    return st.st_size, st.st_mtime_ns


def _walk_images(top: Path) -> list[str]:
    """Image files below ``top`` as sorted POSIX paths relative to ``top`` (symlinks included)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(top)
        for name in filenames:
            if is_image_name(name) and not name.startswith("."):
                found.append((rel / name).as_posix())
    return sorted(found, key=path_key)


def _table(root, layout: str, rows: list[tuple[str, int]], classes, ignored, stat=None) -> Source:
    stats = [(stat or (lambda p: _stat(root / p)))(p) for p, _ in rows]
    return Source(
        root=root,
        layout=layout,
        paths=tuple(p for p, _ in rows),
        labels=np.array([lab for _, lab in rows], dtype=np.int64),
        sizes=np.array([s for s, _ in stats], dtype=np.int64),
        mtimes=np.array([m for _, m in stats], dtype=np.int64),
        classes=tuple(classes),
        ignored=tuple(ignored),
    )


def _read_labels_csv(root, labels_csv: Path, stat=None) -> Source:
    if not labels_csv.is_file():
        raise UsageError(f"labels file {labels_csv} does not exist")
    with open(labels_csv, newline="", encoding="utf-8-sig") as fh:
        rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
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
    names = sorted(seen, key=path_key)
    values = [seen[p] for p in names]
    if all(v.lstrip("-").isdigit() for v in values):
        ints = [int(v) for v in values]
        if min(ints) < -1:
            raise UsageError(f"{labels_csv}: integer labels must be >= -1")
        classes = [str(i) for i in range(max(ints) + 1)]
        labels = ints
    else:
        classes = sorted(set(values))
        index = {c: i for i, c in enumerate(classes)}
        labels = [index[v] for v in values]
    return _table(root, "csv", list(zip(names, labels)), classes, (), stat)


def discover(root: str | os.PathLike, labels_csv: str | os.PathLike | None = None) -> Source:
    """Find the inputs of ``root``.

    - ``labels_csv`` given: exactly the files it lists, with its labels (names or integers).
    - ``root/<class>/**/<image>``: ImageFolder; classes are the sorted sub-folder names, like
      torchvision's ImageFolder. Images directly in ``root`` are then ignored, and reported.
    - otherwise a flat folder: every image in ``root``, label -1.
    """
    if is_url(root):
        return _discover_remote(str(root), labels_csv)
    root = Path(root)
    if not root.exists():
        raise UsageError(f"{root} does not exist")
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder")
    if labels_csv is not None:
        source = _read_labels_csv(root, Path(labels_csv))
    else:
        subdirs = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        per_class = {d: _walk_images(root / d) for d in subdirs}
        classes = [d for d in subdirs if per_class[d]]
        if classes:
            rows = [(f"{c}/{rel}", label) for label, c in enumerate(classes) for rel in per_class[c]]
            ignored = [
                (e.name, "outside any class folder")
                for e in sorted(os.scandir(root), key=lambda e: e.name)
                if not e.is_dir() and is_image_name(e.name)
            ]
            source = _table(root, "imagefolder", rows, classes, ignored)
        else:
            rows = [(rel, -1) for rel in _walk_images(root)]
            source = _table(root, "flat", rows, (), ())
    return _nonempty(source)


def _nonempty(source: Source) -> Source:
    if len(source) == 0:
        exts = " ".join(IMAGE_EXTENSIONS)
        raise UsageError(f"{source.root} holds no images (looked for {exts}, any case)")
    return source


def _mtime_ns(info: dict) -> int:
    """A file's modification time in ns from an fsspec listing; or a number derived from its ETag."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
    tag = str(info.get("ETag") or info.get("etag") or "")
    return int.from_bytes(hashlib.sha256(tag.encode()).digest()[:7], "big")


def _discover_remote(url: str, labels_csv: str | os.PathLike | None) -> Source:
    """``discover`` for a folder on object storage (an fsspec URL): one listing, same layouts."""
    fs, base = filesystem(url)
    try:
        found = fs.find(base, detail=True)
    except FileNotFoundError:
        found = {}
    if not found:
        raise UsageError(f"{url} does not exist or holds no files")
    files = {}
    for path, info in found.items():
        rel = path[len(base) :].lstrip("/")
        if not rel or info.get("type") == "directory" or any(p.startswith(".") for p in rel.split("/")):
            continue
        files[rel] = (int(info.get("size") or 0), _mtime_ns(info))

    def stat(rel: str) -> tuple[int, int]:
        return files.get(rel, (-1, -1))

    if labels_csv is not None:
        return _nonempty(_read_labels_csv(url, Path(labels_csv), stat))
    images = sorted((r for r in files if is_image_name(r)), key=path_key)
    nested = [r for r in images if "/" in r]
    if nested:
        classes = sorted({r.split("/", 1)[0] for r in nested})
        index = {c: i for i, c in enumerate(classes)}
        rows = [(r, index[r.split("/", 1)[0]]) for r in nested]
        ignored = [(r, "outside any class folder") for r in images if "/" not in r]
        return _nonempty(_table(url, "imagefolder", rows, classes, ignored, stat))
    return _nonempty(_table(url, "flat", [(r, -1) for r in images], (), (), stat))
