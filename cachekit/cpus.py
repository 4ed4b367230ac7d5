"""How many CPUs this process may really use: affinity, capped by a container's cgroup CPU quota."""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["available_cpus", "cgroup_cpu_limit", "local_world_size", "CGROUP_ROOT", "PROC_CGROUP"]

#: Where the cgroup filesystem and this process's cgroup membership are read from (tests point them elsewhere).
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _membership(proc_cgroup: Path) -> tuple[str | None, str | None]:
    """This process's cgroup paths: (v2 unified path, v1 path of the cpu controller)."""
    v2 = v1 = None
    for line in (_read(proc_cgroup) or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2 = path.strip() or "/"
        elif "cpu" in controllers.split(","):
            v1 = path.strip() or "/"
    return v2, v1


def _up_to(mount: Path, path: str | None) -> list[Path]:
    """``mount/path`` and every folder above it up to ``mount``: a quota anywhere on the way applies."""
    folders = [mount]
    if path and path != "/":
        own = mount / path.lstrip("/")
        if own.is_dir():  # else the path is the host's, outside this (namespaced) mount
            folders = [own, *[p for p in own.parents if p == mount or mount in p.parents]]
    return folders


def cgroup_cpu_limit(
    root: str | os.PathLike | None = None, proc_cgroup: str | os.PathLike | None = None
) -> float | None:
    """CPUs allowed by the cgroup quota, or None if unlimited: the smallest quota of this process's
    cgroup and all its ancestors, v2 (``cpu.max``) and v1 (``cpu.cfs_quota_us / cpu.cfs_period_us``)."""
    root = Path(root or CGROUP_ROOT)
    v2, v1 = _membership(Path(proc_cgroup or PROC_CGROUP))
    limits = []
    for folder in _up_to(root, v2):
        text = _read(folder / "cpu.max")  # "<quota> <period>" or "max <period>"
        if text:
            quota, _, period = text.partition(" ")
            if quota != "max" and period and int(period) > 0:
                limits.append(int(quota) / int(period))
    mounts = [root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")] + [root]
    seen = set()
    for mount in mounts:
        if not mount.is_dir() or mount.resolve() in seen:
            continue
        seen.add(mount.resolve())
        for folder in _up_to(mount, v1):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota and period and int(quota) > 0 and int(period) > 0:
                limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def local_world_size() -> int:
    """Processes sharing this node's CPUs: ``LOCAL_WORLD_SIZE`` (torchrun sets it), else, in an
    initialised process group, its world size capped by this node's GPUs, else 1."""
    raw = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return min(world, gpus) if gpus else world
    return 1


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
