"""Downloads ahead give the link to readers: demand marks seen across processes, small pieces, a few at a time."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

from cachekit.feed import linkshare
from cachekit.feed.linkshare import Background, Demand


class CountingFS:
    """A filesystem whose ranged GETs are recorded, with the number in flight."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.flying = self.most = 0
        self.lock = threading.Lock()

    def cat_file(self, path, start=None, end=None):
        with self.lock:
            self.flying += 1
            self.most = max(self.most, self.flying)
            self.calls.append((start, end))
        time.sleep(0.002)
        with self.lock:
            self.flying -= 1
        return b"x" * (end - start)

    def info(self, path):
        return {"size": 1}


def _hold(folder, name, ready, release) -> None:
    with Demand(folder).waiting(name):
        ready.set()
        release.wait(30)


def test_a_reader_in_another_process_is_seen_and_a_dead_one_is_not(tmp_path):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(tmp_path), "shard-1.pt", ready, release))
    proc.start()
    try:
        assert ready.wait(60)
        demand = Demand(tmp_path)
        assert demand.anyone() and demand.wanted("shard-1.pt") and not demand.wanted("shard-2.pt")
    finally:
        proc.kill()  # the kernel lets its locks go
        proc.join()
    assert not Demand(tmp_path).anyone()


def test_downloads_ahead_wait_while_a_reader_waits_unless_it_waits_for_theirs(tmp_path, monkeypatch):
    monkeypatch.setattr(linkshare, "BACKGROUND_PIECE_BYTES", 100)
    demand, fs = Demand(tmp_path), CountingFS()
    other = Background(fs, demand, "shard-2.pt")
    mine = Background(fs, demand, "shard-1.pt")
    assert len(mine.cat_file("shard-1.pt", 0, 300)) == 300  # nobody waits: in pieces of 100 bytes
    assert fs.calls == [(0, 100), (100, 200), (200, 300)]
    with demand.waiting("shard-1.pt"):
        assert len(mine.cat_file("shard-1.pt", 0, 1000)) == 1000  # the reader's own: one GET, at once
        assert fs.calls[3:] == [(0, 1000)]
        got = []
        worker = threading.Thread(target=lambda: got.append(other.cat_file("shard-2.pt", 0, 300)))
        worker.start()
        time.sleep(0.2)
        assert len(fs.calls) == 4 and not got  # another shard's download waits
    worker.join(10)
    assert got == [b"x" * 300] and len(fs.calls) == 7 and other.yielded_s > 0.1


def test_downloads_ahead_keep_a_few_requests_in_flight(tmp_path, monkeypatch):
    monkeypatch.setattr(linkshare, "BACKGROUND_PIECE_BYTES", 10)
    fs = CountingFS()
    threads = [
        threading.Thread(
            target=Background(fs, Demand(tmp_path), f"shard-{k}.pt").cat_file, args=("p", 0, 200)
        )
        for k in range(12)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fs.calls) == 12 * 20 and fs.most <= linkshare.BACKGROUND_REQUESTS
