"""Durable, all-or-nothing file commits: write to a temp name, fsync, rename; and file checksums."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["commit_file", "fsync_dir", "sha256_file", "temp_name"]

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


def commit_file(path: Path, write: Callable[[Path], None]) -> tuple[int, str]:
    """Have ``write`` produce the file at a temp name, make it durable, then rename it to ``path``.

    Returns (bytes, sha256). A crash at any point leaves either no ``path`` or the complete file.
    """
    tmp = temp_name(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return size, digest
