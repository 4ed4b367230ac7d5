"""One writer per cache folder: a kernel lock (``flock``) on a lock file, released when its holder dies.

The lock file also names its holder (pid, host, start time) so that a refused build can say who
holds it. The kernel, not that text, decides who holds the lock: a holder that dies, even by
SIGKILL, releases it at once, and a stale file left behind is simply locked again. A releasing
holder unlinks the file while it still holds the lock; a process that opened the old file in the
meantime notices (the path no longer leads to the file it locked) and starts over, so two
processes never both believe they hold it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from ..constants import LOCK_NAME
from ..errors import BuildError

__all__ = ["BuildLock"]

#: Attempts at a lock whose file is unlinked and recreated under us before giving up.
_ATTEMPTS = 50


class BuildLock:
    """Context manager holding an exclusive kernel lock on ``FOLDER/.cachekit.lock`` for a build."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None

    def _holder(self, fd: int) -> str:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            holder = json.loads(os.read(fd, 4096) or b"{}")
            return f"pid {holder.get('pid')} on {holder.get('host')}"
        except (OSError, ValueError, AttributeError):
            return "a process that has not yet said which"

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            return os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise BuildError(f"{self.path} is a symlink; remove it") from None
            raise BuildError(f"cannot write to {self.path.parent}: {exc.strerror}") from None

    def acquire(self) -> None:
        """Take the lock or raise BuildError naming its holder; never waits for another build."""
        for _ in range(_ATTEMPTS):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise BuildError(f"cannot lock {self.path}: {exc.strerror}") from None
                holder = self._holder(fd)
                os.close(fd)
                raise BuildError(
                    f"{self.path.parent}: another build is writing here ({holder}); "
                    "wait for it to finish (its lock goes when it exits)"
                ) from None
            # Locked; but is it still the file at our path? A holder releasing the lock unlinks
            # the file before it unlocks, and another process may since have created a new one.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                time.sleep(0.001)
                continue
            me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(me).encode(), 0)
            except OSError:
                pass  # the lock holds without the note (a full disk); only the message is poorer
            self._fd = fd
            return
        raise BuildError(f"could not take the lock {self.path}: it kept being replaced")

    def release(self) -> None:
        """Unlink the lock file, then unlock (in that order: see the module's docstring)."""
        if self._fd is None:
            return
        try:
            if os.path.samestat(os.fstat(self._fd), os.stat(self.path, follow_symlinks=False)):
                self.path.unlink()
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
