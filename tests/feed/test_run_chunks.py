"""The threads over a batch: every sample exactly once, in pieces small enough that each thread has work."""

from __future__ import annotations

import threading

import pytest

from cachekit.feed.chunks import CHUNK, run_chunks


def _pieces(n: int, threads: int) -> list[tuple[int, int]]:
    seen, lock = [], threading.Lock()

    def fn(lo: int, hi: int) -> None:
        with lock:
            seen.append((lo, hi))

    run_chunks(n, threads, fn)
    return sorted(seen)


@pytest.mark.parametrize("n, threads", [(0, 4), (1, 4), (16, 16), (16, 2), (64, 2), (100, 3), (7, 1)])
def test_every_sample_once(n, threads):
    covered = [i for lo, hi in _pieces(n, threads) for i in range(lo, hi)]
    assert covered == list(range(n))


def test_a_small_batch_is_cut_so_every_thread_has_a_piece():
    assert _pieces(16, 16) == [(i, i + 1) for i in range(16)]  # 16 mosaics, 16 threads: one each
    assert _pieces(16, 4) == [(i, i + 4) for i in range(0, 16, 4)]
    assert _pieces(256, 2) == [(i, i + CHUNK) for i in range(0, 256, CHUNK)]  # large batches: CHUNK


def test_an_error_in_any_piece_reaches_the_caller():
    def fn(lo: int, hi: int) -> None:
        if lo <= 9 < hi:
            raise ValueError("sample 9")

    with pytest.raises(ValueError, match="sample 9"):
        run_chunks(32, 4, fn)


def test_a_call_from_inside_a_thread_over_the_batch_reads_its_pieces_itself(monkeypatch):
    """A batch read from inside a thread over another batch (a user op that reads a loader of its own)
    finds the pool's threads busy with the outer batch: its caller reads every piece, and does not wait
    for the pieces it handed out, which could only start once the outer ones end (they wait on it)."""
    import cachekit.feed.chunks as chunks
    from cachekit.feed.prefetch import ReadTimeout

    monkeypatch.setattr(chunks, "_pools", {})  # a pool of the outer batch's two threads, no more
    inner, lock, both = [], threading.Lock(), threading.Barrier(2, timeout=10)

    def read_inner(lo: int, hi: int) -> None:
        with lock:
            inner.extend(range(lo, hi))

    def read_outer(lo: int, hi: int) -> None:
        both.wait()  # each of the pool's threads holds a piece of the outer batch
        run_chunks(16, 2, read_inner, timeout=5)

    try:
        run_chunks(16, 2, read_outer, timeout=20)
    except ReadTimeout:
        pytest.fail("a batch read inside a thread over another batch waited for threads that never came free")
    assert sorted(inner) == sorted(list(range(16)) * len(_pieces(16, 2)))


def test_a_pool_another_reader_gave_up_on_still_reads_the_batch(monkeypatch):
    """Two loaders read from two threads; one's batch times out and leaves the shared pool behind just
    as the other has looked it up: the other's batch is read there, not refused with 'cannot schedule
    new futures after shutdown'."""
    import cachekit.feed.chunks as chunks

    looked_up = chunks._pool

    def then_given_up(threads: int):
        pool = looked_up(threads)
        chunks._forget(pool)  # the other reader's timeout, landing between lookup and submit
        return pool

    monkeypatch.setattr(chunks, "_pool", then_given_up)
    seen, lock = [], threading.Lock()

    def fn(lo: int, hi: int) -> None:
        with lock:
            seen.extend(range(lo, hi))

    run_chunks(64, 4, fn, timeout=10)
    assert sorted(seen) == list(range(64))


def test_a_failing_call_from_inside_a_thread_over_the_batch_says_its_error(monkeypatch):
    """As above, the inner batch's own piece failing: its error comes at once, not a timeout after the
    helpers it handed out, queued behind the busy pool."""
    import cachekit.feed.chunks as chunks
    from cachekit.feed.prefetch import ReadTimeout

    monkeypatch.setattr(chunks, "_pools", {})
    both = threading.Barrier(2, timeout=10)

    def read_inner(lo: int, hi: int) -> None:
        raise ValueError("sample 3 is damaged")

    def read_outer(lo: int, hi: int) -> None:
        both.wait()
        run_chunks(16, 2, read_inner, timeout=5)

    try:
        with pytest.raises(ValueError, match="sample 3 is damaged"):
            run_chunks(16, 2, read_outer, timeout=20)
    except ReadTimeout:
        pytest.fail("the inner batch's error waited for helpers that could not start")


def test_a_batch_queued_behind_another_threads_batch_is_read_whole(monkeypatch):
    """Two loaders read from two user threads share the pool: a batch whose caller only waits (the user's
    thread, with a timeout) and whose helpers are queued behind the other batch's pieces is read whole
    once they start, none of its helpers given up for having not started yet."""
    import cachekit.feed.chunks as chunks

    monkeypatch.setattr(chunks, "_pools", {})
    pool, release = chunks._pool(2), threading.Event()
    others = [pool.submit(release.wait, 10) for _ in range(2)]  # the other batch's pieces, under way
    threading.Timer(0.3, release.set).start()
    seen, lock = [], threading.Lock()

    def fn(lo: int, hi: int) -> None:
        with lock:
            seen.extend(range(lo, hi))

    run_chunks(16, 2, fn, timeout=10)
    assert sorted(seen) == list(range(16))
    # the other batch's pieces end too (one of its threads may not have been scheduled yet to say so
    # when this batch's last helper, on the other thread, has read every piece)
    assert all(f.result(10) is True for f in others)
