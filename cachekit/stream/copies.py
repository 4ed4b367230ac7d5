"""Local shard copies checked before reuse: a record written when a download is verified, and the check.

A copy in the node cache is only ever served when it holds the manifest's bytes. Hashing every
shard at every open would cost a full read of it, so a verified copy gets a small record beside
it (``.NAME.verified``): the sha256 it was verified against and the copy's *stamp*, what the
filesystem says about it (size, inode, device, modification and change times in nanoseconds; for
a folder shard, those of every entry in it). Reuse compares the stamp and the sha256 with the
record: while nothing about the copy changed it is trusted without a read; anything written to
it since, even with its modification time set back, changes the change time the kernel keeps,
so it is hashed again in full, and refetched when it does not match.

Bit rot on the medium (bytes that change under an unchanged inode) is what ``cachekit verify``
and a re-download are for; the check here is against changes made through the filesystem.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from ..store.atomic import path_size, sha256_path
from ..store.private import read_nofollow, replace_file

__all__ = ["stamp", "record_path", "record_verified", "verified_copy", "forget_copy"]


def _entry(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns, stat.S_IFMT(st.st_mode)]


def stamp(path: Path) -> list:
    """What the filesystem says about the copy at ``path`` (links are not followed)."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return [_entry(st)]
    found = [["", *_entry(st)]]
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            found.append([os.path.relpath(full, path), *_entry(os.lstat(full))])
    return found


def record_path(path: Path) -> Path:
    """Where the record of the copy at ``path`` is kept: a hidden sibling."""
    return path.with_name(f".{path.name}.verified")


def record_verified(path: Path, sha256: str) -> None:
    """Record that the copy at ``path``, as it is now, was checked to hold bytes of ``sha256``."""
    replace_file(record_path(path), json.dumps({"sha256": sha256, "stamp": stamp(path)}).encode())


def forget_copy(path: Path) -> None:
    """Remove the record of the copy at ``path`` (the copy is gone or about to be replaced)."""
    record_path(path).unlink(missing_ok=True)


def _recorded(path: Path) -> dict | None:
    text = read_nofollow(record_path(path), 1 << 24)
    try:
        obj = json.loads(text) if text else None
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def verified_copy(path: Path, size: int, sha256: str, *, rehash: bool = True) -> bool:
    """True when the copy at ``path`` holds ``size`` bytes of ``sha256``.

    Trusted without reading it when its record matches; otherwise (``rehash``) hashed in full,
    and recorded again when it matches. A link in the copy's place is never a copy.
    """
    try:
        now = stamp(path)
        if stat.S_ISLNK(now[0][-1]) or path_size(path) != size:
            return False
    except OSError:
        return False
    record = _recorded(path)
    if record is not None and record.get("sha256") == sha256 and record.get("stamp") == now:
        return True
    if not rehash:
        return False
    try:
        if sha256_path(path) != sha256:
            return False
        record_verified(path, sha256)
    except OSError:
        return False
    return True
