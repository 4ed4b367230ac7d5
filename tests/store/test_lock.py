"""The build lock is a kernel lock: refused while held, free when its holder dies, no takeover race."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner

from cachekit import BuildConfig, BuildError, build
from cachekit.cli import main
from cachekit.constants import LOCK_NAME
from cachekit.store.lock import BuildLock

_HOLD = textwrap.dedent(
    """
    import sys, time
    from cachekit.store.lock import BuildLock
    lock = BuildLock(sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def _holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_build_into_the_same_folder_is_refused(small_tree, tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    holder = _holder(out)
    try:
        result = CliRunner().invoke(
            main, ["build", str(small_tree), "--out", str(out), "--size", "32", "--quiet"]
        )
        assert result.exit_code == 1
        assert "another build is writing here" in result.output and f"pid {holder.pid}" in result.output
        assert not (out / "manifest.json").exists()
    finally:
        holder.kill()
        holder.wait()
    # SIGKILLed holder: the kernel released its lock; its lock file is simply taken
    assert (out / LOCK_NAME).exists()
    result = build(small_tree, out, BuildConfig(size=32, workers=1, progress=False))
    assert result.status == "built" and not (out / LOCK_NAME).exists()


def test_a_stale_lock_file_naming_a_live_process_is_not_a_lock(small_tree, tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    # what an older cachekit (or a crash) leaves: a lock file nobody holds, naming a live pid
    (out / LOCK_NAME).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    assert build(small_tree, out, BuildConfig(size=32, workers=1, progress=False)).status == "built"


def test_two_locks_in_one_process_exclude_each_other(tmp_path):
    with BuildLock(tmp_path):
        with pytest.raises(BuildError, match="another build is writing here"):
            BuildLock(tmp_path).acquire()
    with BuildLock(tmp_path):  # released: free again
        pass


def test_a_symlinked_lock_file_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("precious")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / LOCK_NAME).symlink_to(target)
    with pytest.raises(BuildError, match="symlink"):
        BuildLock(tmp_path / "c").acquire()
    assert target.read_text() == "precious"


def _racer(folder, log, start, rounds, wins) -> None:
    """Try for the lock ``rounds`` times; log entry and exit around each hold."""
    start.wait()
    won = 0
    for _ in range(rounds):
        lock = BuildLock(folder)
        try:
            lock.acquire()
        except BuildError:
            time.sleep(0.0002)
            continue
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.write(fd, f"+{os.getpid()}\n".encode())
        time.sleep(0.001)
        os.write(fd, f"-{os.getpid()}\n".encode())
        os.close(fd)
        lock.release()
        won += 1
    wins.put(won)


def test_many_processes_racing_for_the_lock_never_hold_it_together(tmp_path):
    """16 processes x 40 attempts, each holder logging entry and exit: never two inside at once."""
    folder, log = tmp_path / "c", tmp_path / "log"
    folder.mkdir()
    log.write_text("")
    (folder / LOCK_NAME).write_text('{"pid": 999999999, "host": "gone"}')  # a stale file to take over
    ctx = multiprocessing.get_context("fork")
    wins, start = ctx.Queue(), ctx.Barrier(16)
    racers = [ctx.Process(target=_racer, args=(folder, log, start, 40, wins)) for _ in range(16)]
    for p in racers:
        p.start()
    total = sum(wins.get(timeout=60) for _ in racers)
    for p in racers:
        p.join(10)
    inside = None
    entries = log.read_text().split()
    for line in entries:
        if line.startswith("+"):
            assert inside is None, f"{line[1:]} took the lock while {inside} held it"
            inside = line[1:]
        else:
            assert inside == line[1:]
            inside = None
    assert total == len(entries) // 2 >= 8  # the lock changed hands many times
    assert not (folder / LOCK_NAME).exists()


def test_a_holder_killed_by_sigterm_to_its_group_leaves_no_lock(small_tree, tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert holder.stdout.readline().strip() == "held"
    os.killpg(holder.pid, signal.SIGTERM)
    holder.wait()
    with BuildLock(tmp_path):
        pass


def test_a_lock_file_replaced_between_open_and_lock_is_not_held(tmp_path, monkeypatch):
    """The takeover race, forced: the holder releases (unlinking the file) and a third process
    takes a fresh file just after we opened the old one; we must not believe we hold the lock."""
    import fcntl as real_fcntl

    import cachekit.store.lock as lock_module

    holder, third = BuildLock(tmp_path), BuildLock(tmp_path)
    holder.acquire()

    class Racing:
        LOCK_EX, LOCK_NB = real_fcntl.LOCK_EX, real_fcntl.LOCK_NB
        raced = False

        def flock(self, fd, op):
            if not Racing.raced:
                Racing.raced = True
                holder.release()  # unlinks the file our fd was opened on
                third.acquire()  # creates and locks a new one at the same path
            return real_fcntl.flock(fd, op)

    monkeypatch.setattr(lock_module, "fcntl", Racing())
    with pytest.raises(BuildError, match="another build is writing here"):
        BuildLock(tmp_path).acquire()
    assert third.held
    third.release()
