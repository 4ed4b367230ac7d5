"""Room in shared memory for worker processes: DataLoader workers hand every batch over through /dev/shm.

Docker gives a container 64 MB of /dev/shm unless told otherwise (``--shm-size``, ``--ipc=host``),
and Kubernetes pods the same unless an ``emptyDir`` of ``medium: Memory`` is mounted there. A
worker process that cannot place a batch there dies with a multi-line ``RuntimeError: unable to
allocate shared memory(shm)``; this module says so before any worker starts, in one line.
"""

from __future__ import annotations

import os

from ..errors import UsageError

__all__ = ["SHM_PATH", "shm_free_bytes", "shm_needed_bytes", "shm_shortfall", "ShmTooSmall"]

#: Where torch's worker processes put the batches they hand over (POSIX shared memory on Linux).
SHM_PATH = "/dev/shm"


class ShmTooSmall(UsageError, ValueError):
    """Worker processes were asked for, and /dev/shm cannot hold the batches they would hand over."""


def shm_free_bytes(path: str | None = None) -> int | None:
    """Free bytes in the shared-memory filesystem, or None where there is none to measure (macOS)."""
    try:
        st = os.statvfs(path or SHM_PATH)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def shm_needed_bytes(batch_bytes: int, workers: int, prefetch_factor: int) -> int:
    """Bytes the batches in flight take: each worker keeps ``prefetch_factor`` batches ready, and one
    more is being filled while the main process still holds the one it is copying out."""
    return int(batch_bytes) * max(0, int(workers)) * (max(1, int(prefetch_factor)) + 1)


def shm_shortfall(
    batch_bytes: int, workers: int, prefetch_factor: int, path: str | None = None
) -> str | None:
    """A one-line reason why ``workers`` worker processes would run out of shared memory, or None.

    None also when there are no workers or nothing to measure. The line names the fix.
    """
    if workers <= 0:
        return None
    free = shm_free_bytes(path)
    need = shm_needed_bytes(batch_bytes, workers, prefetch_factor)
    if free is None or need <= free:
        return None
    return (
        f"{path or SHM_PATH} has {free / 2**20:,.0f} MiB free, and {workers} worker processes x "
        f"{prefetch_factor + 1} batches of {batch_bytes / 2**20:,.1f} MiB need {need / 2**20:,.0f} MiB: "
        "give the container more shared memory (docker run --shm-size=8g, or --ipc=host), "
        "or read in-process (workers=0)"
    )
