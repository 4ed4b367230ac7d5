"""SIGTERM is Ctrl-C: one line, exit 143, workers stopped, lock released; workers never outlive the build."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cachekit.constants import PARTIAL_DIR
from cachekit.store.lock import BuildLock
from cachekit.tools.verify import verify


def _cmd(raw: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cachekit.cli",
        "build",
        str(raw),
        "--out",
        str(out),
        "--shard-size",
        "4",
        "--workers",
        "2",
        "--size",
        "64",
        "--quiet",
    ]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(raw: Path, out: Path, **popen) -> tuple[subprocess.Popen, list[int]]:
    """A build running its workers, stopped once it has finished a shard or two."""
    proc = subprocess.Popen(_cmd(raw, out), stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((out / PARTIAL_DIR).glob("shard-*.json"))) >= 1 and len(_children(proc.pid)) >= 2:
            break
        time.sleep(0.01)
    workers = _children(proc.pid)
    assert proc.poll() is None and len(workers) >= 2, "the build finished before it could be stopped"
    return proc, workers


def _gone(pids: list[int], within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [False, True], ids=["build-process", "process-group"])
def test_sigterm_stops_workers_releases_the_lock_and_exits_143(big_tree, tmp_path, to_group):
    out = tmp_path / "cache"
    proc, workers = _start(big_tree, out, start_new_session=True)
    if to_group:
        os.killpg(proc.pid, signal.SIGTERM)  # what Slurm's scancel sends
    else:
        os.kill(proc.pid, signal.SIGTERM)  # what Kubernetes sends to the container's process
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines() == ["terminated (SIGTERM); re-run the same command to resume"]
    assert _gone(workers)
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    with BuildLock(out):  # free
        pass
    again = subprocess.run(_cmd(big_tree, out), capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.startswith("resumed:"), again.stderr
    assert verify(out).ok


@pytest.mark.slow
def test_workers_die_with_a_sigkilled_build(big_tree, tmp_path):
    out = tmp_path / "cache"
    proc, workers = _start(big_tree, out, start_new_session=True)
    os.kill(proc.pid, signal.SIGKILL)  # the build alone: nobody tells the workers
    proc.wait()
    assert _gone(workers), "worker processes outlived the build"
    with BuildLock(out):
        pass
