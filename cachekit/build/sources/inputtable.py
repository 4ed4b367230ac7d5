"""A build's inputs as a table (``Source``), and the walk of a local folder that fills it.

The building blocks of every source (folders, annotations, files of records, Python datasets): they
sit below the readers of each layout and import none of them.

Discovery never hangs and never loops: only regular files become inputs (a FIFO, a device or a
dangling link is reported, never opened), a symlinked folder is followed once and a link back to
a folder already walked or to an ancestor of the raw root is reported as a loop, not followed.
Paths are POSIX strings relative to the root; a file name that is not UTF-8 keeps its bytes as
lone surrogates (``os.fsdecode``), so it round-trips through the manifest unchanged.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ...constants import IMAGE_EXTENSIONS, UNREAD_IMAGE_EXTENSIONS
from ...errors import UsageError
from .records import RecordReader

__all__ = [
    "Source",
    "inputs_digest",
    "is_image_name",
    "path_key",
    "path_bytes",
    "paths_bytes",
    "Walk",
    "walk",
    "table",
    "file_problem",
    "stat_problem",
    "nonempty",
    "unread_extension",
    "is_dir",
]


def path_key(path: str) -> tuple[str, ...]:
    """Sort key of a relative POSIX path: folder by folder, so ``a/x`` sorts before ``a-b/x``."""
    return tuple(path.split("/"))


def path_bytes(path: str) -> bytes:
    """The file-name bytes of a discovered path (UTF-8, or the original bytes of a non-UTF-8 name)."""
    return path.encode("utf-8", "surrogateescape")


def is_image_name(name: str) -> bool:
    """True for file names with a recognised image extension, in any case."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def unread_extension(name: str) -> str | None:
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
    layout: str  # the name of its row in ``sources.layouts.LAYOUTS``
    paths: Sequence[str]  # a tuple, or (object storage) a compact ``listing.PathColumn``
    labels: np.ndarray  # int64, -1 when unlabelled
    sizes: np.ndarray  # int64 bytes
    mtimes: np.ndarray  # int64 ns
    classes: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...] = ()  # (path, reason) found but not usable as inputs
    unread: dict[str, int] = field(default_factory=dict)  # extension -> files of it not read
    #: The sample's fields besides the image (``FieldSpec`` by name; none for classification).
    fields: dict = field(default_factory=dict)
    #: Per input, its raw targets (JSON-able: boxes in its own pixels, its mask file, ...); or ().
    targets: tuple = ()
    #: Annotations left out (a bad box, a bad row), each ``(where, reason)``; their inputs are kept.
    dropped: tuple[tuple[str, str], ...] = ()
    #: What the manifest's ``source`` records besides the layout (COCO's category ids, ...).
    extra: dict = field(default_factory=dict)
    #: How a shard job reads inputs that are not files under ``root`` (``records.RecordReader``); None: files.
    reader: RecordReader | None = None
    #: What the user says the source is (``source_id=``), part of every shard's name; "" for files.
    identity: str = ""

    def __len__(self) -> int:
        return len(self.paths)

    def with_targets(self, fields: dict, targets, dropped, extra: dict) -> Source:
        """This source with ``fields`` and each input's raw targets (in ``paths`` order)."""
        targets = tuple(targets)
        if len(targets) != len(self.paths):
            raise ValueError("one target per input")
        return replace(self, fields=dict(fields), targets=targets, dropped=tuple(dropped), extra=dict(extra))

    def subset(self, rows, ignored=()) -> Source:
        """The inputs ``rows`` only (in order), with ``ignored`` added to what was left out."""
        rows = list(rows)
        return replace(
            self,
            paths=tuple(self.paths[i] for i in rows),
            labels=self.labels[rows],
            sizes=self.sizes[rows],
            mtimes=self.mtimes[rows],
            targets=tuple(self.targets[i] for i in rows) if self.targets else (),
            ignored=tuple(sorted([*self.ignored, *ignored])),
        )

    def digest(self, rows: np.ndarray | range | None = None) -> str:
        """sha256 over (path, size, mtime, label) of the given rows, in order: changes iff they do."""
        return inputs_digest(self, range(len(self)) if rows is None else rows)


def paths_bytes(paths: Sequence[str], rows) -> list[bytes]:
    """The file-name bytes of ``paths[rows]``, in order (a ``PathColumn`` cuts them from its buffer)."""
    encoded = getattr(paths, "encoded", None)
    if encoded is not None:
        return encoded(rows)
    return [path_bytes(paths[i]) for i in np.asarray(rows, dtype=np.int64).tolist()]


def inputs_digest(source: Source, rows) -> str:
    """sha256 of the rows' paths, sizes, mtimes, labels and (when the source has fields) targets.

    The same bytes as hashing row by row, gathered a page of rows at a time: the numeric columns
    as Python ints (``tolist``), the paths as bytes, one update a page (1M inputs: about a second)."""
    h = hashlib.sha256()
    if source.identity:
        h.update(f"source\0{source.identity}\n".encode())
    rows = np.asarray(rows if not isinstance(rows, range) else np.arange(rows.start, rows.stop, rows.step))
    rows = rows.astype(np.int64, copy=False)
    for lo in range(0, len(rows), 65536):
        page = rows[lo : lo + 65536]
        columns = zip(
            paths_bytes(source.paths, page),
            source.sizes[page].tolist(),
            source.mtimes[page].tolist(),
            source.labels[page].tolist(),
        )
        if not source.targets:
            h.update(b"".join([b"%s\0%d\0%d\0%d\n" % row for row in columns]))
            continue
        for (path, size, mtime, label), i in zip(columns, page.tolist()):
            target = json.dumps(source.targets[i], sort_keys=True, separators=(",", ":")).encode()
            h.update(b"%s\0%d\0%d\0%d\n%s\n" % (path, size, mtime, label, target))
    return h.hexdigest()


@dataclass
class Walk:
    """What a walk of a local tree found: inputs with their stat, and what it left out."""

    files: list[tuple[str, int, int]] = field(default_factory=list)  # (rel, size, mtime_ns)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    unread: Counter = field(default_factory=Counter)
    visited: set[tuple[int, int]] = field(default_factory=set)


def file_problem(st: os.stat_result) -> str | None:
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


def stat_problem(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop"
    if exc.errno == errno.ENOENT:
        return "unreadable: dangling symlink"
    return f"unreadable: {exc.strerror or exc}"


def walk(root: Path, top_rel: str, found: Walk) -> None:
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
            found.ignored.append((rel, stat_problem(exc)))
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
                ext = unread_extension(entry.name)
                if ext is not None:
                    found.unread[ext] += 1
                continue
            try:
                st = entry.stat()  # follows symlinks: a link to /dev/zero is a device
            except OSError as exc:
                found.ignored.append((child, stat_problem(exc)))
                continue
            problem = file_problem(st)
            if problem is not None:
                found.ignored.append((child, problem))
            else:
                found.files.append((child, st.st_size, st.st_mtime_ns))
        stack.extend(reversed(subdirs))


def table(root, layout: str, rows: list[tuple[str, int, int, int]], classes, ignored, unread) -> Source:
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


def is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def nonempty(source: Source) -> Source:
    if len(source) == 0:
        exts = " ".join(IMAGE_EXTENSIONS)
        unread = (
            f"; found only {', '.join(f'{n} {ext}' for ext, n in source.unread.items())}, which cachekit does not read"
            if source.unread
            else ""
        )
        raise UsageError(f"{source.root} holds no images (looked for {exts}, any case){unread}")
    return source


def local_folder(text: str) -> Path:
    """``text`` as a local folder; one line when it does not exist or is no folder."""
    root = Path(text)
    if not root.exists():
        raise UsageError(f"{root} does not exist")
    if not root.is_dir():
        raise UsageError(f"{root} is not a folder")
    return root
