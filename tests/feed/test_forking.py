"""What a fork of this process waits for (``feed.forking``), and how a forked worker proves it can use
OpenCV before it works (``feed.safefork``): real forks, their children answering through pipes."""

from __future__ import annotations

import os
import select
import sys
import textwrap
import threading

import cv2
import pytest

import cachekit.feed.forking as forking
import cachekit.feed.safefork as safefork
from cachekit import CachedDataset, make_loader


def _fork(child) -> str:
    """Fork; the child runs ``child()`` and writes what it returns; the parent reads it (30 s at most)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.close(read)
            os.write(write, str(child()).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 30)
        return os.read(read, 4096).decode() if ready else "(no answer: the child hung)"
    finally:
        os.close(read)
        os.kill(pid, 9) if _alive(pid) else None
        os.waitpid(pid, 0)


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def test_a_fork_waits_for_the_pieces_under_way_and_holds_new_ones_back():
    inside, release, left, entered_after = threading.Event(), threading.Event(), threading.Event(), []

    def piece() -> None:
        with forking.working():
            inside.set()
            release.wait(30)
        left.set()

    def later() -> None:
        with forking.working():
            entered_after.append(left.is_set())

    worker = threading.Thread(target=piece)
    worker.start()
    assert inside.wait(10)
    threading.Timer(0.2, release.set).start()
    answer = _fork(lambda: "child")
    assert left.is_set(), "the fork went ahead while a piece was under way"
    assert answer == "child"
    worker.join()
    after = threading.Thread(target=later)
    after.start()
    after.join(10)
    assert entered_after == [True]  # new pieces go on once the fork is over


def test_a_piece_that_forks_does_not_wait_for_itself(monkeypatch):
    monkeypatch.setattr(forking, "FORK_WAIT_SECONDS", 10_000.0)
    answers = []

    def piece() -> None:
        with forking.working(), forking.working():  # nested too
            answers.append(_fork(lambda: "child"))

    worker = threading.Thread(target=piece, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "a fork inside a piece waited for that piece to end"
    assert answers == ["child"]


def test_opencv_s_pool_is_gone_in_the_child_and_given_back_in_the_parent():
    before = cv2.getNumThreads()
    cv2.setNumThreads(3)
    try:
        assert _fork(lambda: cv2.getNumThreads()) == "1"
        assert cv2.getNumThreads() == 3
    finally:
        cv2.setNumThreads(before)


def test_an_import_under_way_in_another_thread_is_waited_for(tmp_path, monkeypatch):
    """A module another thread is importing when the fork comes: its import lock would be held for ever
    in the child, whose own import of it would never end."""
    (tmp_path / "slowmodule.py").write_text(
        textwrap.dedent(
            """
            import time
            import cachekit_test_signal as signal
            signal.started.set()
            time.sleep(0.5)
            DONE = True
            """
        )
    )
    signal = type(sys)("cachekit_test_signal")
    signal.started = threading.Event()
    monkeypatch.setitem(sys.modules, "cachekit_test_signal", signal)
    monkeypatch.syspath_prepend(str(tmp_path))
    importer = threading.Thread(target=__import__, args=("slowmodule",))
    importer.start()
    assert signal.started.wait(10)

    def child() -> str:
        import slowmodule

        return str(slowmodule.DONE)

    assert _fork(child) == "True"
    importer.join()
    sys.modules.pop("slowmodule", None)


def test_a_worker_that_cannot_use_opencv_is_forked_again(small_cache, tmp_path, monkeypatch):
    """The first fork of each worker finds OpenCV wedged (here: its probe never returns); it exits
    ``WEDGED`` within ``PROBE_SECONDS`` and is forked again, and the loader reads every sample."""
    marks = tmp_path / "marks"
    marks.mkdir()
    real = safefork.probe_opencv

    def wedged_once() -> None:
        mark = marks / str(os.getppid())
        try:
            fd = os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return real()
        os.close(fd)
        threading.Event().wait()  # as a lock held for ever

    monkeypatch.setattr(safefork, "probe_opencv", wedged_once)
    monkeypatch.setattr(safefork, "PROBE_SECONDS", 0.5)
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 8, workers=2)
    assert sum(len(x) for x, _ in loader) == len(ds)
    assert len(list(marks.iterdir())) == 1  # one parent, the first fork wedged, then fine


def test_a_worker_that_never_can_is_one_line(small_cache, monkeypatch):
    monkeypatch.setattr(safefork, "probe_opencv", lambda: threading.Event().wait())
    monkeypatch.setattr(safefork, "PROBE_SECONDS", 0.3)
    monkeypatch.setattr(safefork, "ATTEMPTS", 2)
    loader = make_loader(CachedDataset(small_cache), 8, workers=1)
    with pytest.raises(safefork.ForkWedged) as info:
        next(iter(loader))
    said = str(info.value)
    assert "\n" not in said and "forked 2 times" in said and "multiprocessing_context='forkserver'" in said
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == os.getpid()]
    assert all(_state(int(p)) != "Z" for p in children)  # the wedged ones were reaped


def _stat(pid: int) -> list[str]:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return ["X", "0", "0"]


def _parent(pid: int) -> int:
    return int(_stat(pid)[1])


def _state(pid: int) -> str:
    return _stat(pid)[0]


def test_the_probe_runs_every_kind_of_call_a_worker_makes():
    """It returns, here, on a process whose OpenCV is fine (and names no function cv2 lacks)."""
    safefork.probe_opencv()
