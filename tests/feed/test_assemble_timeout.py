"""The threads over a batch, read in the training process with no prefetch thread: a stuck read ends in
the loader's ``timeout=`` as one line, instead of a wait for ever."""

from __future__ import annotations

import pickle
import threading

import pytest

import cachekit.feed.assemble as assemble
from cachekit import CachedDataset, make_loader
from cachekit.augment.transforms import RandomResizedCrop
from cachekit.feed.assemble import BatchRequest, run_chunks
from cachekit.feed.prefetch import ReadTimeout


def _stuck_in_pool_threads(monkeypatch) -> threading.Event:
    """Every sample read by a thread of the batch's pool waits for the event (storage that hangs); the
    reading thread waits until a pool thread has taken a piece, so that one surely has."""
    release, taken = threading.Event(), threading.Event()
    source = assemble._source

    def stuck(dataset, reader, i):
        if threading.current_thread().name.startswith("cachekit-read"):
            taken.set()
            release.wait(60)
        else:
            taken.wait(10)
        return source(dataset, reader, i)

    monkeypatch.setattr(assemble, "_source", stuck)
    return release


def _next_batch_in_a_thread(loader) -> tuple[threading.Thread, list]:
    """The first batch, read in a thread of its own so that a wait for ever shows as a live thread."""
    found: list = []

    def read():
        try:
            found.append(next(iter(loader)))
        except BaseException as exc:  # handed to the test
            found.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, found


def test_a_stuck_thread_over_the_batch_ends_in_the_loaders_timeout(small_cache, monkeypatch):
    release = _stuck_in_pool_threads(monkeypatch)
    loader = make_loader(
        CachedDataset(small_cache), 8, workers=0, prefetch_thread=False, threads=2, timeout=0.5,
        augment=[RandomResizedCrop(16)], shuffle=False,
    )  # fmt: skip
    assert "prefetch thread" not in loader.mode and "2 threads" in loader.mode
    reader, found = _next_batch_in_a_thread(loader)
    reader.join(30)
    release.set()  # the stuck read ends: its thread goes back
    assert not reader.is_alive(), "the batch waited for its stuck thread past the loader's timeout"
    (error,) = found
    assert isinstance(error, ReadTimeout) and isinstance(error, TimeoutError)
    assert str(error).startswith("a thread over the batch read no more samples in 0.5 s")
    assert "\n" not in str(error)
    monkeypatch.undo()  # reads answer again: the next pass reads on a fresh pool
    images, labels = next(iter(loader))
    assert tuple(images.shape) == (8, 3, 16, 16) and len(labels) == 8


def test_a_batch_within_its_timeout_is_read_whole(small_cache):
    loader = make_loader(CachedDataset(small_cache), 8, workers=0, prefetch_thread=False, threads=2, timeout=30)
    plain = make_loader(CachedDataset(small_cache), 8, workers=0, prefetch_thread=False, threads=1)
    for (a, la), (b, lb) in zip(loader, plain):
        assert (a == b).all() and (la == lb).all()


def test_run_chunks_waits_its_timeout_for_the_other_threads():
    release, seen = threading.Event(), []

    taken = threading.Event()

    def fn(lo, hi):
        if threading.current_thread().name.startswith("cachekit-read"):
            taken.set()
            release.wait(60)
        else:
            taken.wait(10)
        seen.append((lo, hi))

    with pytest.raises(ReadTimeout, match=r"in 0.2 s"):
        run_chunks(16, 2, fn, timeout=0.2)
    release.set()
    run_chunks(16, 2, lambda lo, hi: seen.append((lo, hi)), timeout=5)  # a fresh pool answers


def test_a_request_keeps_its_timeout_through_a_pickle():
    request = BatchRequest([3, 1], epoch=2, seed=5, threads=3, timeout=7.5)
    again = pickle.loads(pickle.dumps(request))
    assert again.timeout == 7.5 and list(again) == [3, 1] and (again.epoch, again.seed, again.threads) == (2, 5, 3)
    assert BatchRequest([0]).timeout == assemble.READ_TIMEOUT_SECONDS


@pytest.mark.parametrize("threads", [1, 2])
def test_the_users_thread_only_waits_while_a_prefetch_thread_works_too(threads):
    """With a timeout, the user's thread hands every piece to the pool (a piece it ran itself could
    hold it for ever, past any timeout); our prefetch thread, whose wait its consumer bounds, and a
    call with no timeout take pieces themselves."""

    def names_of(timeout, thread_name=None) -> set[str]:
        names: list[str] = []
        covered: list[int] = []

        def piece(lo: int, hi: int) -> None:
            names.append(threading.current_thread().name)
            covered.extend(range(lo, hi))

        def run():
            run_chunks(32, threads, piece, timeout)

        if thread_name is None:
            run()
        else:
            caller = threading.Thread(target=run, name=thread_name)
            caller.start()
            caller.join(30)
        assert sorted(covered) == list(range(32))  # every sample, once
        return set(names)

    here = threading.current_thread().name
    assert all(name.startswith("cachekit-read") for name in names_of(5.0))
    assert here in names_of(None)
    assert "cachekit-prefetch" in names_of(5.0, "cachekit-prefetch")


def test_ctrl_c_while_the_users_thread_waits_stops_the_batchs_threads(monkeypatch):
    """Ctrl-C reaches a caller that only waits for the threads over the batch (the user's thread with a
    timeout): the threads stop at their next piece and the interrupt goes on, rather than being held
    until every piece of the batch is read (or, behind a stuck user op, until the timeout)."""
    import _thread
    import os

    import cachekit.feed.chunks as chunks

    monkeypatch.setattr(chunks, "_pools", {})  # a pool of this test's own, to wait for at the end
    done, lock, release = [], threading.Lock(), threading.Event()

    def fn(lo: int, hi: int) -> None:
        with lock:
            done.append(lo)
            first = len(done) == 1
        if first:
            _thread.interrupt_main()  # as a SIGINT another thread took: the main thread sees it when it wakes
        release.wait(30)  # every piece under way waits until the interrupt has been raised

    with pytest.raises(KeyboardInterrupt):
        run_chunks(400, 2, fn, timeout=60)
    release.set()
    chunks._pools[os.getpid()].shutdown(wait=True)  # the threads' work, all of it, is over
    # each of the two threads read at most the piece it held when Ctrl-C came, of 50
    assert 1 <= len(done) <= 2, "Ctrl-C left the threads reading the batch"
