"""What a cache folder may hold for a shard: a plain name, a regular file or a folder of them, no links.

Checked from the entries' own types before anything is opened: a FIFO would block the first read,
a device or socket would be read as data, a symlink could lead anywhere. The rules only: a shard's
own entry is checked by ``shardinfo.shard_path``, its file by the formats.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from ..errors import CacheError

__all__ = ["OpenFilesExhausted", "check_shard_name", "check_plain_tree", "out_of_files"]

_SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


class OpenFilesExhausted(CacheError):
    """The process hit its limit of open files (EMFILE/ENFILE) while opening a shard.

    Raised by readers so that a pool of open shards can close some and try again, instead of
    reporting the shard as unreadable.
    """


def out_of_files(exc: BaseException) -> bool:
    """True when ``exc`` says the process or system ran out of file descriptors."""
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return True
    text = str(exc)  # HDF5 and torch wrap the OS error in their own message
    return "Too many open files" in text or "errno = 24" in text


def check_shard_name(name: object, where: str = "shard file") -> str:
    """Return ``name`` if it is a plain file name inside the cache folder, else raise CacheError."""
    if not isinstance(name, str) or not name:
        raise CacheError(f"{where}: expected a file name, got {name!r}")
    if "/" in name or "\\" in name or name in (".", "..") or os.path.isabs(name) or "\x00" in name:
        raise CacheError(f"{where}: {name!r} is not a plain file name inside the cache folder")
    if not _SHARD_NAME.match(name) or ".." in name:
        raise CacheError(f"{where}: {name!r} has characters not allowed in a shard name")
    return name


def check_plain_tree(folder: Path) -> None:
    """Raise CacheError unless ``folder`` holds only folders and regular files, no links.

    Checked from the entries' own types (``lstat``) before anything is opened: a FIFO would block
    the first ``open``, a device or socket would be read as data, a symlink could lead anywhere.
    """
    stack = [folder]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError as exc:
            if out_of_files(exc):
                raise OpenFilesExhausted(f"{folder.name}: cannot be listed ({exc.strerror})") from None
            raise CacheError(f"cannot be listed ({exc.strerror or exc})") from None
        for entry in entries:
            rel = Path(entry.path).relative_to(folder).as_posix()
            if entry.is_symlink():
                raise CacheError(f"holds a symlink, {rel} (shard folders must hold plain files)")
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif not entry.is_file(follow_symlinks=False):
                raise CacheError(
                    f"holds {rel}, which is not a regular file (shard folders must hold plain files)"
                )
