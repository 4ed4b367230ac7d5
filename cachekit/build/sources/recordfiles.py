"""Files of records named by a pattern (``data/train-*.parquet``, ``shards/train-{000000..000099}.tar``),
local or on object storage: the pattern expanded, each file a regular file with its size and stamp,
and opened for reading in a worker (a local file without following links, or an fsspec file)."""

from __future__ import annotations

import glob
import os
import re
import stat
from dataclasses import dataclass, field

import numpy as np

from ...errors import UsageError
from ...store.remote import access_error, filesystem, is_url, process_filesystem
from .inputtable import Source, file_problem
from .pydataset import class_names
from .samplefields import classes_seen, fields_of_targets
from .sourceoptions import SourceOptions, recorded_options

__all__ = [
    "RecordFile",
    "RecordRows",
    "bytes_read",
    "expand_braces",
    "find_files",
    "open_file",
    "pattern_folder",
    "read_range",
]

#: The most files a brace pattern may name (a typo of ``{0..9999999999}`` must not list forever).
MAX_FILES = 1_000_000
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_LIST = re.compile(r"\{([^{}]*,[^{}]*)\}")


@dataclass(frozen=True)
class RecordFile:
    """One file of a source: its name in the build (relative to the pattern's folder), where it is,
    its size and stamp (part of every input's digest: a changed file rebuilds its shards)."""

    name: str
    where: str  # a local path, or a path inside the URL's filesystem
    size: int
    mtime: int


@dataclass
class RecordRows:
    """The samples found in a source's files, a column each, as its discovery reads them."""

    paths: list = field(default_factory=list)
    targets: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    sizes: list = field(default_factory=list)
    mtimes: list = field(default_factory=list)
    ignored: list = field(default_factory=list)  # (where, reason) left out

    def add(self, rel: str, target: dict, label: int, file: RecordFile) -> None:
        """One sample of ``file``: its size and stamp are the file's (a changed file rebuilds its
        shards), so the sizes of a file's samples are not summed: ``bytes_read`` counts each file once."""
        self.paths.append(rel)
        self.targets.append(target)
        self.labels.append(label)
        self.sizes.append(file.size)
        self.mtimes.append(file.mtime)

    def source(
        self,
        pattern: str,
        layout: str,
        files: list[RecordFile],
        options: SourceOptions,
        *,
        kind: str,
        names,
        reader,
        columns: bool = True,
        identity: str = "",
        unit: str = "samples",
    ) -> Source:
        """The ``Source`` of these rows of ``files`` (one line when there are none): class names from
        ``options.classes`` (the user's), else ``names`` (the files' own), else numbers, never fewer
        than the rows use; ``kind`` names the files and ``unit`` their samples in messages. The
        manifest records how many files and the options they were read with (``columns``: the
        Parquet column options too)."""
        if not self.paths:
            why = "; ".join(f"{p}: {r}" for p, r in self.ignored[:3])
            raise UsageError(f"{pattern} holds no {unit} a build can use" + (f" ({why})" if why else ""))
        labels = np.array(self.labels, dtype=np.int64)
        fields = fields_of_targets(self.targets, labels)
        seen = classes_seen(self.targets, labels)
        found = class_names(options.classes, names, False, kind) or tuple(str(i) for i in range(seen))
        if len(found) < seen:
            raise UsageError(f"{pattern}: class {seen - 1} is past the {len(found)} class names")
        return Source(
            root=pattern,
            layout=layout,
            paths=tuple(self.paths),
            labels=labels,
            sizes=np.array(self.sizes, dtype=np.int64),
            mtimes=np.array(self.mtimes, dtype=np.int64),
            classes=tuple(found),
            ignored=tuple(self.ignored),
            fields=fields,
            targets=tuple(self.targets),
            extra={"files": len(files), **recorded_options(options, fields, columns=columns)},
            reader=reader,
            identity=identity,
        )


def bytes_read(sizes, targets, rows) -> int:
    """The bytes of storage that reading inputs ``rows`` touches: a file of records (Parquet, a tar:
    its inputs' targets say ``"at": [file, ...]`` and their size is the whole file's) counted once,
    however many of its records are read; any other input (a file of its own) at its size."""
    seen: set = set()
    total = 0
    for i in rows:
        target = targets[i] if len(targets) else None
        at = target.get("at") if isinstance(target, dict) else None
        if at is not None:
            if at[0] in seen:
                continue
            seen.add(at[0])
        total += max(0, int(sizes[i]))
    return total


def expand_braces(pattern: str) -> list[str]:
    """``{000..099}`` (zero-padded as written) and ``{a,b}`` expanded, left to right."""
    out, todo = [], [pattern]
    while todo:
        text = todo.pop(0)
        m = _RANGE.search(text)
        n = _LIST.search(text)
        if m and (not n or m.start() < n.start()):
            a, b = int(m.group(1)), int(m.group(2))
            if b < a or b - a >= MAX_FILES:
                raise UsageError(
                    f"{pattern}: {{{m.group(1)}..{m.group(2)}}} must count up, by fewer than {MAX_FILES}"
                )
            width = len(m.group(1)) if m.group(1).startswith("0") else 0
            todo += [text[: m.start()] + str(v).zfill(width) + text[m.end() :] for v in range(a, b + 1)]
        elif n:
            todo += [text[: n.start()] + part + text[n.end() :] for part in n.group(1).split(",")]
        else:
            out.append(text)
        if len(out) + len(todo) > MAX_FILES:
            raise UsageError(f"{pattern} names more than {MAX_FILES} files")
    return out


def pattern_folder(pattern: str) -> str:
    """The folder the names of ``pattern``'s files are relative to, the folder before its first pattern
    character (``data`` of ``data/train-*.parquet``; "" for the working folder)."""
    cut = min((pattern.find(c) for c in "*?[{" if c in pattern), default=len(pattern))
    return pattern[:cut].rsplit("/", 1)[0] if "/" in pattern[:cut] else ""


def find_files(pattern: str, storage_options: dict | None, what: str) -> list[RecordFile]:
    """The files ``pattern`` names, sorted, each checked to be a regular file (one line when none is)."""
    names = expand_braces(pattern)
    found: dict[str, RecordFile] = {}
    if is_url(pattern):
        fs, _ = filesystem(pattern, storage_options)
        protocol = pattern.split("://", 1)[0]
        base = filesystem(pattern_folder(pattern) or pattern, storage_options)[1] if pattern_folder(pattern) else ""
        for name in names:
            path = filesystem(name, storage_options)[1]
            try:
                hits = fs.glob(path, detail=True) if glob.has_magic(path) else {path: fs.info(path)}
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise access_error(pattern, exc, UsageError, "list") from None
            for p, info in hits.items():
                if info.get("type") == "file":
                    rel = p[len(base) :].lstrip("/") if base and p.startswith(base) else p.rsplit("/", 1)[-1]
                    stamp = info.get("mtime") or info.get("LastModified") or info.get("ETag") or 0
                    found[p] = RecordFile(rel, f"{protocol}://{p}", int(info.get("size") or 0), _stamp(stamp))
    else:
        base = pattern_folder(pattern)
        for name in names:
            for p in sorted(glob.glob(name)) if glob.has_magic(name) else [name]:
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                if file_problem(st) is not None:
                    raise UsageError(f"{p} is {file_problem(st)}: a {what} must be a regular file")
                rel = os.path.relpath(p, base) if base else p
                found[p] = RecordFile(rel.replace(os.sep, "/"), p, st.st_size, st.st_mtime_ns)
    if not found:
        raise UsageError(f"{pattern} names no {what} files")
    return sorted(found.values(), key=lambda f: f.name)


def _stamp(value) -> int:
    if isinstance(value, (int, float)):
        return int(value * 1e9) if isinstance(value, float) else int(value)
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1e9)
    return int.from_bytes(str(value).encode()[:8].ljust(8, b"\0"), "little") >> 1


def open_file(where: str, url: bool, storage_options: dict | None):
    """A binary file object for reading: a local regular file (never a FIFO or device), or an fsspec file."""
    if url:
        fs, path = process_filesystem(where, storage_options)
        return fs.open(path, "rb")
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{where} is not a regular file")
    return os.fdopen(fd, "rb")


def read_range(fh, offset: int, size: int) -> bytes:
    """``size`` bytes of an open file at ``offset`` (short: the file changed or was cut)."""
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise OSError(f"{size} bytes at {offset} asked, {len(data)} read: the file was cut or changed")
    return data
