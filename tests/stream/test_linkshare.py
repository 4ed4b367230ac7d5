"""Downloads ahead give the link to readers: demand marks seen across processes, small pieces, a few at a time."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import numpy as np

from cachekit import CachedDataset, make_loader, read_manifest
from cachekit.stream import linkshare
from cachekit.stream.linkshare import Background, Demand


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


def test_the_first_batch_comes_after_its_own_shards_not_the_lookahead(
    mixed_s3_cache, throttled_link, tmp_path, monkeypatch
):
    from cachekit.store import remote
    from cachekit.stream import linkshare

    monkeypatch.setattr(remote, "_PART", 8192)  # shards of many ranged GETs, as big shards are
    monkeypatch.setattr(linkshare, "BACKGROUND_PIECE_BYTES", 4096)
    url, local = mixed_s3_cache
    shard_bytes = int(np.median([s.bytes for s in read_manifest(local).shards]))
    link = throttled_link(20 * shard_bytes, 0.002)  # a shard's download alone: 1/20 s
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    loader = make_loader(
        ds, 24, seed=1, prefetch_thread=False
    )  # the next batch is not read before this one is out
    assert ds._remote.fetcher(ds.shard_offsets).ahead >= 8  # the lookahead: every shard at once
    before = len(link.log)  # the manifest
    it = iter(loader)
    next(it)
    shards = np.searchsorted(ds.shard_offsets, loader.sampler.last_indices[:24], side="right") - 1
    needed = {ds.manifest.shards[k].file for k in set(shards.tolist())}
    served = [(path.rsplit("/", 1)[-1], size) for _, path, size in link.log[before:]]  # in the link's order
    last = max(i for i, (name, _) in enumerate(served) if name in needed)
    ahead = sum(size for name, size in served[:last] if name not in needed)
    # the link carried the batch's shards with at most a few small pieces of downloads ahead before
    # them, whatever the clock (before downloads ahead gave way, the lookahead's first 8 shards went
    # at once, the batch's among them)
    assert ahead <= linkshare.BACKGROUND_REQUESTS * 4096 * 2, (ahead, served[: last + 1])
    rest = [y for _, labels in it for y in labels.tolist()]
    assert len(rest) + 24 == 96 and not ds._remote.fetcher(ds.shard_offsets).errors
    assert sorted(ds._remote.cache.downloads()) == sorted(s.file for s in ds.manifest.shards)
