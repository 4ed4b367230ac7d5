"""Where a node keeps its shard copies, and the files it keeps beside them.

The folder is the user's own and private: ``CACHEKIT_LOCAL_CACHE``, else
``$XDG_CACHE_HOME/cachekit/shards``, else ``~/.cache/cachekit/shards`` (never a predictable name
in a folder every user may write in), made mode 0700 and owner-checked by ``store.private``. Lock
files and the marker of a folder of copies are opened or replaced without following links.
"""

from __future__ import annotations

import errno
import math
import numbers
import os
import stat
from pathlib import Path

from ..constants import env_int
from ..errors import CacheError, UsageError
from ..store.private import open_nofollow, replace_file

__all__ = [
    "DEFAULT_LOCAL_CACHE_BYTES",
    "MARKER",
    "default_cache_folder",
    "byte_limit",
    "open_lock",
    "mark_folder",
]

#: Default bound of the node's shard cache (bytes); CACHEKIT_LOCAL_CACHE_BYTES overrides it.
DEFAULT_LOCAL_CACHE_BYTES = env_int("CACHEKIT_LOCAL_CACHE_BYTES", 20 * 1024**3)
#: The file that marks a folder of shard copies as this cache's own.
MARKER = ".cachekit-shards"
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT


def default_cache_folder() -> Path:
    """``CACHEKIT_LOCAL_CACHE``, else ``$XDG_CACHE_HOME/cachekit/shards`` (an absolute one), else
    ``~/.cache/cachekit/shards``: the same for every process of a user, and nobody else's."""
    env = os.environ.get("CACHEKIT_LOCAL_CACHE", "").strip()
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "cachekit" / "shards"
    try:
        home = Path.home()
    except RuntimeError:
        raise UsageError(
            "no home folder to keep shard copies in: set CACHEKIT_LOCAL_CACHE or pass local_cache="
        ) from None
    return home / ".cache" / "cachekit" / "shards"


def byte_limit(value: object) -> int:
    """``local_cache_bytes`` as a whole number of bytes (None: the default), or one UsageError."""
    if value is None:
        return DEFAULT_LOCAL_CACHE_BYTES
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"local_cache_bytes must be a number of bytes, got {value!r}")
    if not math.isfinite(value) or value < 1:
        raise UsageError(f"local_cache_bytes must be a positive, finite number of bytes, got {value!r}")
    return int(value)


def open_lock(path: Path) -> int:
    """The lock file at ``path``, opened without following links. Anything but a regular file in
    its place (a link, a FIFO) is removed, the entry itself, and a lock file made instead."""
    for attempt in range(3):
        try:
            return open_nofollow(path, _LOCK_FLAGS)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EINVAL, errno.ENXIO) or attempt == 2:
                raise CacheError(f"{path}: cannot be opened as a lock file ({exc.strerror or exc})") from None
            path.unlink(missing_ok=True)
    raise AssertionError("unreachable")


def mark_folder(folder: Path) -> None:
    """Mark ``folder`` as one of the node cache's own; a marker that is not a plain file (a link,
    dangling or not) is replaced, never written through."""
    marker = folder / MARKER
    try:
        plain = stat.S_ISREG(os.lstat(marker).st_mode)
    except FileNotFoundError:
        plain = False
    if not plain:
        replace_file(marker, b"shard copies of a cachekit cache; removed least recently used first\n")
