"""How many CPUs this process may really use: affinity, capped by a container's cgroup CPU quota."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["available_cpus", "cgroup_cpu_limit", "CGROUP_ROOT", "PROC_CGROUP"]

#: Where the cgroup filesystem and this process's cgroup membership are read from (tests point them elsewhere).
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_cgroup_v2(proc_cgroup: Path) -> str | None:
    text = _read(proc_cgroup)
    for line in (text or "").splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup_cpu_limit(
    root: str | os.PathLike | None = None, proc_cgroup: str | os.PathLike | None = None
) -> float | None:
    """CPUs allowed by the cgroup quota (v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), or None if unlimited."""
    root = Path(root or CGROUP_ROOT)
    candidates = [root]
    own = _own_cgroup_v2(Path(proc_cgroup or PROC_CGROUP))
    if own and own != "/":
        candidates.insert(0, root / own.lstrip("/"))
    limits = []
    for base in candidates:
        text = _read(base / "cpu.max")  # v2: "<quota> <period>" or "max <period>"
        if text:
            quota, _, period = text.partition(" ")
            if quota != "max" and period:
                limits.append(int(quota) / int(period))
        quota = _read(base / "cpu" / "cpu.cfs_quota_us") or _read(base / "cpu.cfs_quota_us")
        period = _read(base / "cpu" / "cpu.cfs_period_us") or _read(base / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0 and int(period) > 0:
            limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def available_cpus(
    root: str | os.PathLike | None = None, proc_cgroup: str | os.PathLike | None = None
) -> int:
    """CPUs this process can use: ``sched_getaffinity`` capped by the cgroup quota (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        limit = cgroup_cpu_limit(root, proc_cgroup)
    except (ValueError, OSError):
        limit = None
    if limit is not None:
        cpus = min(cpus, max(1, math.ceil(limit)))
    return max(1, cpus)
