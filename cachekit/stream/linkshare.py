"""Foreground first: a download a reader waits for takes the link from the downloads ahead.

A reader that needs a shard the node does not hold marks its *demand* for as long as it waits: a
shared ``flock`` on the node cache folder's ``.demand.lock`` and on the shard's own
``.<shard>.demand.lock`` (kernel locks: a process that dies lets go). Downloads ahead go through
``Background``, which fetches in small ranged GETs (``BACKGROUND_PIECE_BYTES``), a few at a time
per process (``BACKGROUND_REQUESTS``), and before each one waits while any reader on the node
waits for a shard, unless that shard is the very one it fetches (it is then the reader's
download, and goes as fast as one). So the link carries at most a few small background requests ahead of the bytes a
reader waits for, however many shards are being fetched ahead: the first batch comes in about one
shard's time, not a lookahead's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..constants import BACKGROUND_PIECE_BYTES, BACKGROUND_REQUESTS

__all__ = ["Demand", "Background", "BACKGROUND_PIECE_BYTES", "BACKGROUND_REQUESTS"]
_DEMAND = ".demand.lock"
_PROBE = ".demand-probe.lock"
_POLL_S = 0.02  # how soon a download ahead notices that the link is free again

_slots = threading.BoundedSemaphore(max(1, BACKGROUND_REQUESTS))


def _after_fork() -> None:
    """A forked child starts with every slot free (a thread of the parent may have held some)."""
    global _slots
    _slots = threading.BoundedSemaphore(max(1, BACKGROUND_REQUESTS))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _open(path: Path) -> int:
    """A lock file of the node cache folder, opened without following a link."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, 0o600)


class Demand:
    """Readers of the node waiting for shards of the cache folder ``folder``."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def _file(self, name: str | None) -> Path:
        return self.folder / (_DEMAND if name is None else f".{name}.demand.lock")

    @contextlib.contextmanager
    def waiting(self, *names: str) -> Iterator[None]:
        """Mark, node-wide, that this process waits for shard files ``names`` (the folder must exist)."""
        fds = []
        try:
            for path in (self._file(None), *(self._file(name) for name in names)):
                fd = _open(path)
                fds.append(fd)
                fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            for fd in fds:
                os.close(fd)

    def _held(self, name: str | None) -> bool:
        """Whether a reader holds the mark: an exclusive lock on it fails. Probes take turns (a
        node-wide probe lock): two probing at once would each see the other's probe as a reader."""
        try:
            guard = _open(self.folder / _PROBE)
        except OSError:  # no folder yet: nobody waits in it
            return False
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
            fd = _open(self._file(name))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return False
            except BlockingIOError:
                return True
            finally:
                os.close(fd)
        except OSError:
            return False
        finally:
            os.close(guard)

    def anyone(self) -> bool:
        """True while some reader on the node waits for a shard of this folder."""
        return self._held(None)

    def wanted(self, name: str) -> bool:
        """True while some reader on the node waits for shard file ``name``."""
        return self._held(name)


class Background:
    """The filesystem ``fs`` as a download ahead of shard file ``name`` sees it: ranged GETs of
    ``BACKGROUND_PIECE_BYTES``, at most ``BACKGROUND_REQUESTS`` in flight in this process, each
    waiting while a reader waits for another shard. Everything else is ``fs``'s own."""

    def __init__(self, fs, demand: Demand, name: str) -> None:
        self._fs, self._demand, self._name = fs, demand, name
        #: Seconds this download spent giving the link to readers.
        self.yielded_s = 0.0

    def __getattr__(self, attr: str):
        return getattr(self._fs, attr)

    def _next(self, path: str, start: int | None, end: int | None, kwargs: dict) -> tuple[bytes, bool]:
        """The next bytes from ``start``, and whether they reach ``end``: all of them in one GET while
        a reader waits for this very shard (it is the reader's download now); else a piece of
        ``BACKGROUND_PIECE_BYTES``, sent only with a slot free and no reader waiting for another
        shard (checked with the slot held: a request that queued for a slot checks again)."""
        waited = None
        while True:
            if self._demand.wanted(self._name):
                break
            with _slots:
                if not self._demand.anyone():
                    self._yielded(waited)
                    if start is None or end is None:
                        return self._fs.cat_file(path, start=start, end=end, **kwargs), True
                    cut = min(int(end), int(start) + max(1, BACKGROUND_PIECE_BYTES))
                    return self._fs.cat_file(path, start=start, end=cut, **kwargs), cut >= int(end)
            waited = waited or time.monotonic()
            time.sleep(_POLL_S)
        self._yielded(waited)
        return self._fs.cat_file(path, start=start, end=end, **kwargs), True

    def _yielded(self, since: float | None) -> None:
        if since is not None:
            self.yielded_s += time.monotonic() - since

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs) -> bytes:
        parts, at = [], start
        while True:
            data, done = self._next(path, at, end, kwargs)
            parts.append(data)
            if done:
                return b"".join(parts)
            at = int(at) + len(data)
