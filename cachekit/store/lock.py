"""One build at a time per cache folder: a lock file naming its holder; a dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from ..constants import LOCK_NAME
from ..errors import BuildError

__all__ = ["BuildLock"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class BuildLock:
    """Context manager holding ``CACHE/.cachekit.lock`` for the duration of a build."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._held = False

    def _holder(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def acquire(self) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                pid, host = holder.get("pid"), holder.get("host")
                if not holder:
                    # Written by a holder that died between create and write, or being written now.
                    if time.time() - self.path.stat().st_mtime < 5:
                        time.sleep(0.2)
                        continue
                elif host != me["host"] or (isinstance(pid, int) and _alive(pid)):
                    raise BuildError(
                        f"{self.path.parent}: another build is writing here "
                        f"(pid {pid} on {host}); wait for it or remove {self.path} if it is gone"
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is dead
                continue
            except OSError as exc:
                raise BuildError(f"cannot write to {self.path.parent}: {exc.strerror}") from None
            with os.fdopen(fd, "w") as fh:
                json.dump(me, fh)
            self._held = True
            return
        raise BuildError(f"could not take the lock {self.path}")

    def release(self) -> None:
        if self._held:
            self.path.unlink(missing_ok=True)
            self._held = False

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
