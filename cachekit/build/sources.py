"""Discovering raw datasets: ImageFolder layout, a flat folder, or a labels CSV; regular files only.

Discovery never hangs and never loops: only regular files become inputs (a FIFO, a device or a
dangling link is reported, never opened), a symlinked folder is followed once and a link back to
a folder already walked or to an ancestor of the raw root is reported as a loop, not followed.
Paths are POSIX strings relative to the root; a file name that is not UTF-8 keeps its bytes as
lone surrogates (``os.fsdecode``), so it round-trips through the manifest unchanged.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import os
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..constants import IMAGE_EXTENSIONS, UNREAD_IMAGE_EXTENSIONS
from ..errors import UsageError
from ..store.remote import access_error, filesystem, is_url
from .listing import list_files

__all__ = ["Source", "discover", "inputs_digest", "is_image_name", "path_key", "path_bytes"]


def path_key(path: str) -> tuple[str, ...]:
    """Sort key of a relative POSIX path: folder by folder, so ``a/x`` sorts before ``a-b/x``."""
    return tuple(path.split("/"))


def path_bytes(path: str) -> bytes:
    """The file-name bytes of a discovered path (UTF-8, or the original bytes of a non-UTF-8 name)."""
    return path.encode("utf-8", "surrogateescape")


def is_image_name(name: str) -> bool:
    """True for file names with a recognised image extension, in any case."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _unread_extension(name: str) -> str | None:
    ext = os.path.splitext(name)[1].lower()
    return ext if ext in UNREAD_IMAGE_EXTENSIONS else None


@dataclass(frozen=True)
class Source:
    """The inputs of a build, in their stable (sorted) order.

    ``paths`` are POSIX paths relative to ``root``; the numeric columns are numpy arrays. Shard jobs
    receive only their own rows of the table. ``ignored`` lists what was found but cannot be an
    input, with the reason; ``unread`` counts files with image extensions cachekit does not read.
    """

    root: Path | str  # a folder, or an fsspec URL
    layout: str  # "imagefolder" | "flat" | "csv"
    paths: Sequence[str]  # a tuple, or (object storage) a compact ``listing.PathColumn``
    labels: np.ndarray  # int64, -1 when unlabelled
    sizes: np.ndarray  # int64 bytes
    mtimes: np.ndarray  # int64 ns
    classes: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...] = ()  # (path, reason) found but not usable as inputs
    unread: dict[str, int] = field(default_factory=dict)  # extension -> files of it not read

    def __len__(self) -> int:
        return len(self.paths)

    def digest(self, rows: np.ndarray | range | None = None) -> str:
        """sha256 over (path, size, mtime, label) of the given rows, in order: changes iff they do."""
        return inputs_digest(self, range(len(self)) if rows is None else rows)


def inputs_digest(source: Source, rows) -> str:
    h = hashlib.sha256()
    for i in rows:
        h.update(path_bytes(source.paths[i]))
        h.update(f"\0{source.sizes[i]}\0{source.mtimes[i]}\0{source.labels[i]}\n".encode())
    return h.hexdigest()


@dataclass
class _Walk:
    """What a walk of a local tree found: inputs with their stat, and what it left out."""

    files: list[tuple[str, int, int]] = field(default_factory=list)  # (rel, size, mtime_ns)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    unread: Counter = field(default_factory=Counter)
    visited: set[tuple[int, int]] = field(default_factory=set)


def _file_problem(st: os.stat_result) -> str | None:
    if stat.S_ISREG(st.st_mode):
        return None
    kind = (
        "a FIFO"
        if stat.S_ISFIFO(st.st_mode)
        else "a device"
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
        else "a socket"
        if stat.S_ISSOCK(st.st_mode)
        else "a folder"
        if stat.S_ISDIR(st.st_mode)
        else "not a file"
    )
    return f"not a regular file ({kind})"


def _stat_problem(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop"
    if exc.errno == errno.ENOENT:
        return "unreadable: dangling symlink"
    return f"unreadable: {exc.strerror or exc}"


def _walk(root: Path, top_rel: str, found: _Walk) -> None:
    """Add the image files below ``root/top_rel`` to ``found``; every real folder is walked once.

    A symlinked folder is followed when it leads out of RAW (data kept on another disk), never
    when it leads back into RAW (those files are found where they are) or to a folder holding
    RAW (``ln -s /``), and an outside folder reached by two links is walked once.
    """
    real_root = os.path.realpath(root)
    stack = [top_rel]
    while stack:
        rel = stack.pop()
        folder = root / rel if rel else root
        try:
            st = folder.stat()
        except OSError as exc:
            found.ignored.append((rel, _stat_problem(exc)))
            continue
        if rel and folder.is_symlink():
            target = os.path.realpath(folder)
            if target == real_root or target.startswith(real_root.rstrip(os.sep) + os.sep):
                found.ignored.append(
                    (rel, "symlink back into RAW (its files are found where they are), not followed")
                )
                continue
            if real_root.startswith(target.rstrip(os.sep) + os.sep):
                found.ignored.append((rel, "symlink loop (links to a folder that holds RAW), not followed"))
                continue
        ident = (st.st_dev, st.st_ino)
        if ident in found.visited:
            found.ignored.append((rel, "symlink to a folder already walked, not followed"))
            continue
        found.visited.add(ident)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            found.ignored.append((rel or ".", f"unreadable folder: {exc.strerror or exc}"))
            continue
        subdirs = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir()  # follows symlinks
            except OSError:
                is_dir = False
            if is_dir:
                subdirs.append(child)
                continue
            if not is_image_name(entry.name):
                ext = _unread_extension(entry.name)
                if ext is not None:
                    found.unread[ext] += 1
                continue
            try:
                st = entry.stat()  # follows symlinks: a link to /dev/zero is a device
            except OSError as exc:
                found.ignored.append((child, _stat_problem(exc)))
                continue
            problem = _file_problem(st)
            if problem is not None:
                found.ignored.append((child, problem))
            else:
                found.files.append((child, st.st_size, st.st_mtime_ns))
        stack.extend(reversed(subdirs))


def _table(root, layout: str, rows: list[tuple[str, int, int, int]], classes, ignored, unread) -> Source:
    """A Source from ``(path, label, size, mtime_ns)`` rows."""
    return Source(
        root=root,
        layout=layout,
        paths=tuple(r[0] for r in rows),
        labels=np.array([r[1] for r in rows], dtype=np.int64),
        sizes=np.array([r[2] for r in rows], dtype=np.int64),
        mtimes=np.array([r[3] for r in rows], dtype=np.int64),
        classes=tuple(classes),
        ignored=tuple(ignored),
        unread=dict(sorted(unread.items())),
    )


def _read_labels_csv(root, labels_csv: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """``(path, label)`` rows of a labels CSV, sorted by path, and the class names."""
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
        return list(zip(names, ints)), [str(i) for i in range(max(ints) + 1)]
    classes = sorted(set(values))
    index = {c: i for i, c in enumerate(classes)}
    return [(p, index[v]) for p, v in zip(names, values)], classes


def _csv_source(root: Path, labels_csv: Path) -> Source:
    pairs, classes = _read_labels_csv(root, labels_csv)
    rows, ignored = [], []
    for rel, label in pairs:
        try:
            st = (root / rel).stat()
        except OSError as exc:
            ignored.append((rel, _stat_problem(exc)))
            continue
        problem = _file_problem(st)
        if problem is not None:
            ignored.append((rel, problem))
        else:
            rows.append((rel, label, st.st_size, st.st_mtime_ns))
    return _table(root, "csv", rows, classes, ignored, {})


def discover(
    root: str | os.PathLike,
    labels_csv: str | os.PathLike | None = None,
    *,
    storage_options: dict | None = None,
) -> Source:
    """Find the inputs of ``root`` (a folder, or an fsspec URL reached with ``storage_options``).

    - ``labels_csv`` given: exactly the files it lists, with its labels (names or integers).
    - ``root/<class>/**/<image>``: ImageFolder; classes are the sorted sub-folder names, like
      torchvision's ImageFolder. Images directly in ``root`` are then ignored, and reported.
    - otherwise a flat folder: every image in ``root``, label -1.
    """
    if is_url(root):
        return _discover_remote(str(root), labels_csv, storage_options)
    root = Path(root)
    if not root.exists():
        raise UsageError(f"{root} does not exist")
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder")
    if labels_csv is not None:
        return _nonempty(_csv_source(root, Path(labels_csv)))
    try:
        top = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"{root} cannot be listed: {exc.strerror}") from None
    subdirs = [e.name for e in top if not e.name.startswith(".") and _is_dir(e)]
    per_class, visited = {}, {(st.st_dev, st.st_ino) for st in [root.stat()]}
    for d in subdirs:
        walk = _Walk(visited=visited)  # shared: a real folder belongs to one class only
        _walk(root, d, walk)
        per_class[d] = walk
    classes = [d for d in subdirs if per_class[d].files]
    ignored: list[tuple[str, str]] = []
    unread: Counter = Counter()
    for walk in per_class.values():
        ignored += walk.ignored
        unread += walk.unread
    if classes:
        rows = [
            (rel, label, size, mtime)
            for label, c in enumerate(classes)
            for rel, size, mtime in per_class[c].files
        ]
        ignored += [
            (e.name, "outside any class folder") for e in top if not _is_dir(e) and is_image_name(e.name)
        ]
        unread += Counter(ext for e in top if not _is_dir(e) and (ext := _unread_extension(e.name)))
        rows.sort(key=lambda r: path_key(r[0]))
        return _nonempty(_table(root, "imagefolder", rows, classes, sorted(ignored), unread))
    walk = _Walk()
    _walk(root, "", walk)
    rows = sorted(((rel, -1, size, mtime) for rel, size, mtime in walk.files), key=lambda r: path_key(r[0]))
    return _nonempty(_table(root, "flat", rows, (), sorted(walk.ignored), walk.unread))


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _nonempty(source: Source) -> Source:
    if len(source) == 0:
        exts = " ".join(IMAGE_EXTENSIONS)
        unread = (
            f"; found only {', '.join(f'{n} {ext}' for ext, n in source.unread.items())}, which cachekit does not read"
            if source.unread
            else ""
        )
        raise UsageError(f"{source.root} holds no images (looked for {exts}, any case){unread}")
    return source


def _discover_remote(url: str, labels_csv: str | os.PathLike | None, storage_options: dict | None) -> Source:
    """``discover`` for a folder on object storage (an fsspec URL): a paged listing (``listing``), same layouts."""
    fs, base = filesystem(url, storage_options)
    try:
        found = list_files(fs, base)
    except FileNotFoundError:
        found = None
    except Exception as exc:  # credentials, endpoint, I/O: one line
        raise access_error(url, exc, UsageError, "list") from None
    if found is None or len(found) == 0:
        raise UsageError(f"{url} does not exist or holds no files")
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
        elif (ext := _unread_extension(rel)) is not None:
            unread[ext] += 1

    def table(layout: str, rows: np.ndarray, labels: np.ndarray, classes, ignored) -> Source:
        return _nonempty(
            Source(
                root=url,
                layout=layout,
                paths=paths.take(rows),
                labels=np.asarray(labels, dtype=np.int64),
                sizes=found.sizes[rows],
                mtimes=found.stamps[rows],
                classes=tuple(classes),
                ignored=tuple(ignored),
                unread=dict(sorted(unread.items())) if layout != "csv" else {},
            )
        )

    if labels_csv is not None:
        pairs, classes = _read_labels_csv(url, Path(labels_csv))
        wanted = {p: k for k, (p, _) in enumerate(pairs)}
        at = np.full(len(pairs), -1, dtype=np.int64)
        for i, rel in enumerate(paths):
            k = wanted.get(rel)
            if k is not None:
                at[k] = i
        keep = np.flatnonzero(at >= 0)
        labels = [pairs[k][1] for k in keep.tolist()]
        ignored = [(pairs[k][0], "unreadable: not found") for k in np.flatnonzero(at < 0).tolist()]
        return table("csv", at[keep], labels, classes, ignored)
    if nested.any():
        names = sorted(tops)
        rank = np.empty(len(tops), dtype=np.int64)
        for label, name in enumerate(names):
            rank[tops[name]] = label
        rows = np.flatnonzero(nested)
        ignored = [(paths[i], "outside any class folder") for i in np.flatnonzero(image & ~nested).tolist()]
        return table("imagefolder", rows, rank[top_of[rows]], names, ignored)
    rows = np.flatnonzero(image)
    return table("flat", rows, np.full(len(rows), -1), (), ())
