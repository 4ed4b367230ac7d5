"""Durable, all-or-nothing commits: write to a temp name, fsync, rename; and checksums.

A committed path is a file, or a folder of files (a zarr shard); both are renamed into place whole.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

__all__ = ["commit_file", "fsync_dir", "path_size", "remove_path", "sha256_file", "sha256_path", "temp_name"]

_CHUNK = 4 * 1024 * 1024


def temp_name(path: Path) -> Path:
    """A hidden sibling of ``path`` unique to this process; never referenced by a manifest."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def fsync_dir(path: Path) -> None:
    """Make renames inside ``path`` durable (a no-op where folders cannot be fsynced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def _files(folder: Path) -> list[Path]:
    """Every file under ``folder``, in a stable order (symlinks are not followed or allowed)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            found.append(Path(dirpath) / name)
    return found


def sha256_path(path: Path) -> str:
    """sha256 of a file, or of a folder: each file's relative path, size and bytes, in sorted order."""
    if not path.is_dir():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in _files(path):
        h.update(f"{f.relative_to(path).as_posix()}\0{f.stat().st_size}\n".encode())
        with open(f, "rb") as fh:
            while block := fh.read(_CHUNK):
                h.update(block)
    return h.hexdigest()


def path_size(path: Path) -> int:
    """Bytes of a file, or of all files in a folder."""
    if not path.is_dir():
        return path.stat().st_size
    return sum(f.stat().st_size for f in _files(path))


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    targets = _files(path) if path.is_dir() else [path]
    for f in targets:
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    if path.is_dir():
        for dirpath, _, _ in os.walk(path):
            fsync_dir(Path(dirpath))


def commit_file(path: Path, write: Callable[[Path], None]) -> tuple[int, str]:
    """Have ``write`` produce the file (or folder) at a temp name, make it durable, rename it to ``path``.

    Returns (bytes, sha256). A crash at any point leaves either no ``path`` or the complete one.
    """
    tmp = temp_name(path)
    try:
        write(tmp)
        _fsync(tmp)
        size = path_size(tmp)
        digest = sha256_path(tmp)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # a folder cannot be replaced in one rename; it held this same shard
        os.replace(tmp, path)
    finally:
        remove_path(tmp)
    fsync_dir(path.parent)
    return size, digest
