"""The prefetch thread on its own: items in order, errors handed over, read-ahead bounded by its depth,
a wait bounded per item, a second pass refused, and the thread and what it holds freed when stopped."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from cachekit.errors import CachekitError
from cachekit.feed import prefetch
from cachekit.feed.prefetch import READ_TIMEOUT_SECONDS, Prefetcher, ReadTimeout


def _until(condition, polls: int = 2000) -> None:
    """Wait for ``condition`` (the other thread's progress), looking ``polls`` times 10 ms apart: a
    guard against a hang, not a bound on speed."""
    for _ in range(polls):
        if condition():
            return
        time.sleep(0.01)
    pytest.fail("the prefetch thread made no progress")


def _ended(p: Prefetcher) -> bool:
    """Whether ``p``'s thread ended (joined, with a guard against a hang)."""
    p._thread.join(20)
    return not p._thread.is_alive()


def test_every_item_comes_in_order_then_the_end():
    p = Prefetcher(iter(range(50)), 3)
    assert list(p) == list(range(50)) and p.timeout == READ_TIMEOUT_SECONDS == 600.0
    assert _ended(p)
    assert p._thread not in prefetch._LIVE and p._thread.daemon and p._thread.name == "cachekit-prefetch"


def test_an_error_of_the_iterator_is_raised_in_the_consumer_after_the_items_before_it():
    def items():
        yield "a"
        yield "b"
        raise KeyError("shard 3 is gone")

    got = []
    with pytest.raises(KeyError, match="shard 3 is gone"):
        for item in Prefetcher(items(), 2):
            got.append(item)
    assert got == ["a", "b"]


@pytest.mark.parametrize("depth, ahead", [(3, 3), (1, 1), (0, 1)])
def test_the_thread_reads_at_most_depth_items_ahead(depth, ahead):
    taken = []

    def items():
        for i in range(100):
            taken.append(i)
            yield i

    p = Prefetcher(items(), depth)
    _until(lambda: p._queue.full() and len(taken) == ahead + 1)  # the queue full, one more in hand
    time.sleep(0.3)  # room to run on if the bound were wrong
    assert len(taken) == ahead + 1
    it = iter(p)
    assert [next(it) for _ in range(10)] == list(range(10))
    it.close()
    assert _ended(p)
    assert len(taken) < 100 and p._queue.empty()  # stopped, and the batches nobody took were freed


def test_a_pass_ended_early_stops_the_thread_and_frees_its_iterator():
    closed = threading.Event()

    def items():
        try:
            yield from range(10**6)
        finally:
            closed.set()

    p = Prefetcher(items(), 4)
    it = iter(p)
    assert next(it) == 0
    it.close()  # the training loop broke out of the pass
    assert _ended(p)
    assert closed.is_set() and p._thread not in prefetch._LIVE and p._queue.empty()
    with pytest.raises(RuntimeError, match="another began"):
        next(iter(p))  # a pass over a stopped prefetcher is refused, not waited on for ever


def test_a_stuck_read_is_one_line_after_the_timeout_and_a_slow_one_is_not():
    release = threading.Event()

    def stuck():
        release.wait(60)
        yield 1

    p = Prefetcher(stuck(), 2, timeout=0.3)
    with pytest.raises(ReadTimeout, match=r"prefetch thread read no batch in 0\.3 s: a read is stuck") as info:
        next(iter(p))
    assert "\n" not in str(info.value) and isinstance(info.value, (TimeoutError, CachekitError))
    release.set()

    def slow():
        for i in range(8):
            time.sleep(0.15)
            yield i

    # the bound is for each item: 8 items take longer than it in all, none alone does
    assert list(Prefetcher(slow(), 1, timeout=1.0)) == list(range(8))


def test_stopping_a_thread_that_reads_on_warns_and_stopping_at_exit_joins_every_thread(caplog):
    release = threading.Event()

    def stuck():
        release.wait(60)
        yield from range(10**6)

    p = Prefetcher(stuck(), 1)
    with caplog.at_level(logging.WARNING, logger="cachekit"):
        p.stop(0.2)
    assert p._thread.is_alive() and caplog.messages == [
        "a loader's prefetch thread was still reading a batch 0.2 s after it was told to stop"
    ]
    release.set()
    endless = Prefetcher(iter(range(10**6)), 1)  # its queue full: it waits to put its next item
    _until(lambda: endless._queue.full())
    assert endless._thread in prefetch._LIVE
    prefetch._stop_prefetchers()  # what runs at exit: every running thread told to stop and joined
    assert not endless._thread.is_alive() and not p._thread.is_alive()
    assert endless._thread not in prefetch._LIVE and p._thread not in prefetch._LIVE
