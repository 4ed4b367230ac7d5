"""What a process has used so far: CPU seconds, major page faults and bytes read from storage, from /proc.

``doctor`` takes these before and after its timed steps, for the training process and each loader
worker, so that its advice rests on measurements: a cold page cache shows as bytes read from the
storage device and major faults; a warm one as neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

try:
    import resource
except ImportError:  # Windows
    resource = None

__all__ = ["ProcessCounters", "child_pids", "process_counters"]


@dataclass(frozen=True)
class ProcessCounters:
    """Counters of one process; None where this system does not expose them."""

    cpu_s: float
    #: Page faults that had to wait for the storage device.
    major_faults: int | None
    #: Bytes this process caused to be read from storage (``read_bytes`` of ``/proc/PID/io``):
    #: page-cache misses of reads, memory-mapped faults and read-ahead alike; 0 when all is cached.
    read_bytes: int | None

    def __sub__(self, before: ProcessCounters) -> ProcessCounters:
        def diff(a, b):
            return None if a is None or b is None else a - b

        return ProcessCounters(
            self.cpu_s - before.cpu_s,
            diff(self.major_faults, before.major_faults),
            diff(self.read_bytes, before.read_bytes),
        )


def _read_bytes(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:  # no task I/O accounting in this kernel, or not ours to read
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "read_bytes":
            return int(value)
    return None


def process_counters(pid: int | None = None) -> ProcessCounters:
    """The counters of process ``pid`` (default: this one)."""
    pid = os.getpid() if pid is None else pid
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        major: int | None = int(fields[9])
    except (OSError, IndexError, ValueError):
        if pid != os.getpid() or resource is None:
            return ProcessCounters(0.0, None, None)
        usage = resource.getrusage(resource.RUSAGE_SELF)  # no /proc: this process only
        cpu, major = usage.ru_utime + usage.ru_stime, usage.ru_majflt
    return ProcessCounters(cpu, major, _read_bytes(pid))


def child_pids() -> list[int]:
    """Process ids of this process's children (DataLoader workers among them), from /proc."""
    pids = []
    try:
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            pids += [int(p) for p in (task / "children").read_text().split()]
    except OSError:
        pass
    return pids
