"""A loader's worker processes behave like torch's DataLoader's on Linux, and every wait is bounded:
a script with no main guard reads, a dead worker is named, a killed training process leaves none
behind, a stopped worker or a stuck op ends in ``ReadTimeout`` and the process still exits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from cachekit import CachedDataset, make_loader
from cachekit.feed.timeouts import ReadTimeout
from cachekit.feed.workers import WorkerExited, rerun_refusal


def _run(script: str, *args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run ``script`` as a user's training script (a file, no main guard unless it has one)."""
    return subprocess.run(
        [sys.executable, "-c", "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
         script, *args],
        capture_output=True, text=True, timeout=timeout, check=False, **kw,
    )  # fmt: skip


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_a_script_without_the_main_guard_reads_with_workers_started_by_fork(small_cache, tmp_path):
    script = _script(
        tmp_path,
        """
        import sys
        from multiprocessing import forkserver
        from cachekit import make_loader
        loader = make_loader(sys.argv[1], 8, workers=2)
        print(loader.multiprocessing_context.get_start_method(), sum(len(x) for x, _ in loader))
        print("forkserver", getattr(forkserver._forkserver, "_forkserver_pid", None))
        """,
    )
    done = _run(script, str(small_cache))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["fork", "40", "forkserver", "None"]


@pytest.mark.slow  # a spawned worker imports torch: seconds
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_script_without_the_guard_whose_workers_start_afresh_is_told_so_in_one_line(small_cache, tmp_path, method):
    """Workers started by spawn or a forkserver run the script again: the loader says the guard, in
    one line, and the workers running the script again end quietly (no traceback of theirs)."""
    script = _script(
        tmp_path,
        f"""
        import sys
        from cachekit import make_loader
        loader = make_loader(sys.argv[1], 8, workers=2, multiprocessing_context={method!r})
        print("read", sum(len(x) for x, _ in loader))
        """,
    )
    done = _run(script, str(small_cache))
    assert done.returncode == 1 and "read" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("cachekit.feed.workers.WorkerExited: the loader's "), last
    assert f"started by {method} run train.py again" in last and "if __name__ == \"__main__\":" in last
    assert done.stderr.count("Traceback") == 1, done.stderr  # the training script's, no worker's


def test_a_worker_running_the_script_again_is_told_apart(monkeypatch):
    import multiprocessing

    assert rerun_refusal() is None
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    said = rerun_refusal()
    assert said is not None and "again" in said and 'if __name__ == "__main__":' in said and "\n" not in said


def _die_in_worker_1_once(image):
    """A picklable transform: worker 1 exits with code 3 the first time (a flag file beside it)."""
    info = torch.utils.data.get_worker_info()
    flag = Path(os.environ["CACHEKIT_TEST_FLAG"])
    if info is not None and info.id == 1 and not flag.exists():
        flag.write_text("died")
        os._exit(3)
    return image


def test_a_worker_that_dies_is_named_at_once_and_the_next_pass_starts_new_ones(small_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CACHEKIT_TEST_FLAG", str(tmp_path / "died"))
    ds = CachedDataset(small_cache, transform=_die_in_worker_1_once)
    loader = make_loader(ds, 4, workers=2, timeout=300)  # found by its exit, not by the timeout
    with pytest.raises(WorkerExited) as info:
        sum(len(x) for x, _ in loader)
    said = str(info.value)
    assert "\n" not in said and "worker 1 (pid " in said and "exited with code 3" in said, said
    assert isinstance(info.value, RuntimeError)  # as torch's 'exited unexpectedly'
    assert sum(len(x) for x, _ in loader) == len(ds)  # new workers (the flag is set: no death)


_KILLED = """
import sys, time
from cachekit import CachedDataset, make_loader

def _slow(image):
    time.sleep(0.05)
    return image

loader = make_loader(CachedDataset(sys.argv[1], transform=_slow), 4, workers=2)
while True:
    for _ in loader:
        print("batch", flush=True)
"""


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of the process group ``pgid``."""
    alive = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            alive.append(int(entry.name))
    return alive


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killing_the_training_process_leaves_no_worker_behind(small_cache, tmp_path, sig):
    """Kubernetes' or Slurm's SIGTERM, the out-of-memory killer's SIGKILL: the workers, busy with a
    batch, end with their parent (they stayed for minutes behind a forkserver)."""
    script = _script(tmp_path, _KILLED)
    proc = subprocess.Popen(
        [sys.executable, script, str(small_cache)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "batch"  # workers started and busy
        assert len(_group(proc.pid)) == 3
        os.kill(proc.pid, sig)
        proc.wait(30)
        deadline = time.monotonic() + 10  # the bound: none left after 10 s
        while _group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group(proc.pid) == []
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


_WEDGED_EARLY = """
import sys, threading, time
from cachekit.feed.safefork import CheckedForkContext

def start():
    # a worker whose target never reaches worker_init_fn (where torch's workers are told to end
    # with the parent): wedged on a lock it inherited, say
    worker = CheckedForkContext().Process(target=time.sleep, args=(3600,), daemon=True)
    worker.start()
    print(worker.pid, flush=True)

if sys.argv[1] == "main":
    start()
else:
    threading.Thread(target=start).start()
time.sleep(3600)
"""


@pytest.mark.parametrize("forker", ["main", "thread"])
def test_a_worker_wedged_before_its_init_still_ends_with_the_killed_parent(tmp_path, forker):
    """A worker is armed to end with its parent when forked, not only when torch reaches
    ``worker_init_fn``: one stuck before that outlived a killed parent (found alive 2 hours on)."""
    proc = subprocess.Popen(
        [sys.executable, _script(tmp_path, _WEDGED_EARLY), forker], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        worker = int(proc.stdout.readline())
        assert worker in _group(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 10
        while _group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _group(proc.pid) == []
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_stopped_worker_ends_in_readtimeout_and_is_killed(small_cache):
    """``kill -STOP`` on a worker: the wait ends at ``timeout=`` (the main thread never waits on the
    stopped worker's hand-over itself), the stuck workers are killed, and the next pass starts anew."""
    ds = CachedDataset(small_cache)
    loader = make_loader(ds, 4, workers=2, timeout=3)
    batches = iter(loader)
    next(batches)
    stopped = loader.worker_pids()[1]
    os.kill(stopped, signal.SIGSTOP)
    try:
        with pytest.raises(ReadTimeout, match=r"2 worker processes \(started by fork\) in 3 s"):
            for _ in batches:
                pass
    finally:
        try:
            os.kill(stopped, signal.SIGCONT)
        except ProcessLookupError:
            pass
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left stopped
        os.kill(stopped, 0)
    assert sum(len(x) for x, _ in loader) == len(ds)
    assert stopped not in loader.worker_pids()


def test_a_handover_that_never_ends_is_bounded_by_the_timeout(small_cache, monkeypatch):
    """The shared-memory hand-over (this process fetching a batch's file descriptor from a worker)
    runs in a thread of its own: a worker that stops answering there cannot hold the loop past
    ``timeout=``. Here every hand-over waits for ever."""
    import torch.multiprocessing.reductions as reductions

    never = threading.Event()
    monkeypatch.setattr(reductions, "rebuild_storage_fd", lambda *a, **k: never.wait())
    loader = make_loader(CachedDataset(small_cache), 4, workers=1, timeout=2)
    outcome: list = []

    def read() -> None:
        try:
            next(iter(loader))
            outcome.append("a batch")
        except ReadTimeout as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    never.set()
    assert not reader.is_alive(), "the loader waited on the hand-over past its timeout"
    assert isinstance(outcome[0], ReadTimeout), outcome


_STUCK = """
import sys, time
from cachekit import make_loader
from cachekit.transforms import PixelOp, Resize

def stuck(image, rng):
    while True:
        time.sleep(0.2)

loader = make_loader(sys.argv[1], 8, augment=[Resize((16, 16)), PixelOp(stuck)], timeout=2,
                     threads=2, prefetch_thread={prefetch})
{read}
"""


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch-thread", "user-thread"])
@pytest.mark.parametrize("caught", [True, False], ids=["caught", "uncaught"])
def test_after_a_stuck_op_s_readtimeout_the_process_exits(small_cache, tmp_path, prefetch, caught):
    """The threads stuck in the op are not waited for at exit: the script ends (it hung for ever)."""
    read = "next(iter(loader))"
    if caught:
        read = f"try:\n    {read}\nexcept TimeoutError as exc:\n    print(type(exc).__name__)\nprint('end')"
    script = _script(tmp_path, _STUCK.format(prefetch=prefetch, read=read))
    try:
        done = _run(script, str(small_cache), timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit after the ReadTimeout")
    if caught:
        assert done.returncode == 0 and done.stdout.split() == ["ReadTimeout", "end"], done.stderr[-2000:]
    else:
        assert done.returncode == 1 and "ReadTimeout" in done.stderr.strip().splitlines()[-1]
