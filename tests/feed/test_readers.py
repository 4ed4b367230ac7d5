"""The bounded pool of open shard readers: LRU, closed on eviction, never under a read, within ulimit -n."""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from manifests import listed_manifest

from cachekit import CachedDataset, UsageError
from cachekit.feed.readers import ReaderPool, default_max_open
from cachekit.tools.synthetic import write_synthetic_cache


class FakeReader:
    def __init__(self, shard: int, log: list) -> None:
        self.shard, self.log, self.closed = shard, log, False

    def close(self) -> None:
        self.closed = True
        self.log.append(self.shard)


def test_least_recently_used_readers_are_closed_first():
    closed: list[int] = []
    pool = ReaderPool(3)
    for shard in (0, 1, 2, 0, 3, 4):  # 0 is used again before 3 comes: 1 and 2 go first
        with pool.using(shard, lambda shard=shard: FakeReader(shard, closed)):
            pass
    assert closed == [1, 2] and len(pool) == 3 and 0 in pool and 1 not in pool
    assert pool.opened == 5 and pool.closed == 2
    pool.close()
    assert sorted(closed) == [0, 1, 2, 3, 4] and len(pool) == 0


def test_a_reader_still_in_use_is_closed_only_when_released(monkeypatch):
    monkeypatch.setattr(sys, "getrefcount", lambda obj: 1)  # nothing rests on reference counts
    closed: list[int] = []
    pool = ReaderPool(1, on_close=lambda shard: closed.append(-shard))
    held = pool.borrow(0, lambda: FakeReader(0, closed))  # e.g. a read in flight in another thread
    with pool.using(1, lambda: FakeReader(1, closed)):
        assert not held.closed and 0 not in pool and len(pool) == 2
    pool.release(held)
    assert held.closed and closed == [0, 0]  # closed at its release, then on_close(0)
    with pool.using(2, lambda: FakeReader(2, closed)):
        pass
    assert closed == [0, 0, 1, -1]
    with pool.using(3, lambda: FakeReader(3, closed)), pool.using(4, lambda: FakeReader(4, closed)):
        assert closed[-2:] == [2, -2]  # the idle reader goes, not the borrowed one


def test_pool_settings_and_pickling(monkeypatch):
    with pytest.raises(UsageError, match="max_open_shards"):
        ReaderPool(0)
    pool = ReaderPool(5)
    with pool.using(0, lambda: FakeReader(0, [])):
        pass
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.capacity == 5 and len(clone) == 0
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert default_max_open(2) == max(2, min(1024, soft // 4)) and default_max_open(0) == min(1024, soft // 2)
    monkeypatch.setattr("cachekit.feed.readers.MAX_OPEN_SHARDS", 7)
    assert default_max_open(2) == 7


def _open_shard_files(folder: Path) -> tuple[int, int]:
    """(descriptors, memory-mapped regions) of this process that point into ``folder``."""
    gc.collect()
    fds = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            fds += target.startswith(str(folder)) and "/index-" not in target  # shards, not the index
        except OSError:
            pass
    lines = Path("/proc/self/maps").read_text().splitlines()
    maps = sum(str(folder) in line and "/index-" not in line for line in lines)
    return fds, maps


@pytest.mark.parametrize("fmt", ["hdf5", "zarr", "pt"])
def test_evicted_shards_release_their_files_and_batches_stay_intact(fmt, tmp_path):
    cache = write_synthetic_cache(tmp_path / fmt, 60, side=8, shard_size=3, format=fmt)
    reference = CachedDataset(cache, max_open_shards=100).read_batch(np.arange(60))[0].clone()
    ds = CachedDataset(cache, max_open_shards=3)
    order = np.random.default_rng(0).permutation(60)
    first = ds.read_batch(order[:20])[0]  # spans more shards than the pool holds
    kept = first.clone()
    assert torch.equal(first, reference[order[:20]])
    for start in range(20, 60, 8):
        assert torch.equal(ds.read_batch(order[start : start + 8])[0], reference[order[start : start + 8]])
    assert torch.equal(first, kept)  # a batch handed out is never touched by closing its shards
    assert len(ds._readers) <= 3 and ds._readers.closed >= 10
    fds, maps = _open_shard_files(cache)
    assert fds == 0 and maps <= 3  # mapped without keeping a descriptor, and at most 3 maps
    ds.close()
    del first
    assert _open_shard_files(cache) == (0, 0)


def test_readers_are_safe_across_threads(tmp_path):
    cache = write_synthetic_cache(tmp_path / "c", 60, side=8, shard_size=3, format="hdf5")
    reference = CachedDataset(cache, max_open_shards=100).read_batch(np.arange(60))[0].clone()
    ds = CachedDataset(cache, max_open_shards=2)
    errors = []

    def read(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                idx = rng.integers(0, 60, 6)
                if not torch.equal(ds.read_batch(idx)[0], reference[idx]):
                    errors.append("wrong pixels")
        except Exception as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


_UNDER_LIMIT = textwrap.dedent(
    """
    import json, os, resource, sys
    import numpy as np
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    from cachekit import CachedDataset, CacheError
    ds = CachedDataset(sys.argv[1])
    reference = np.load(sys.argv[2])
    ok = True
    for start in range(0, len(ds), 50):  # in order: every shard opened once
        ok &= bool(np.array_equal(ds.read_batch(range(start, start + 50))[0].numpy(), reference[start : start + 50]))
    order = np.random.default_rng(0).permutation(len(ds))
    for start in range(0, 400, 40):  # random: each batch spans ~40 shards, held until it is read
        idx = order[start : start + 40]
        ok &= bool(np.array_equal(ds.read_batch(idx)[0].numpy(), reference[idx]))
    result = {"ok": ok, "capacity": ds.max_open_shards, "open": len(ds._readers),
              "opened": ds._readers.opened, "fds": len(os.listdir("/proc/self/fd"))}
    ds.close()
    hold = []
    try:  # now something else takes every descriptor: a clear error, not a raw OSError
        while True:
            hold.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        ds[0]
    except CacheError as exc:
        result["error"] = str(exc)
    print(json.dumps(result))
    """
)


@pytest.mark.slow
def test_a_thousand_hdf5_shards_under_ulimit_128(tmp_path, monkeypatch):
    # compressed: each open reader keeps its file open (uncompressed shards are mapped, keeping none)
    with monkeypatch.context() as m:
        m.setattr(os, "fsync", lambda fd: None)  # durability is not under test: 5 s less
        cache = write_synthetic_cache(
            tmp_path / "c", 2000, side=8, shard_size=2, format="hdf5", compression="gzip"
        )
    files = [s["file"] for s in listed_manifest(cache)["shards"]]
    assert len(files) == 1000
    reference = []
    for name in files:  # read without cachekit
        with h5py.File(cache / name, "r") as f:
            reference.append(f["images"][()])
    np.save(tmp_path / "reference.npy", np.concatenate(reference))
    run = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, str(cache), str(tmp_path / "reference.npy")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert result["ok"] and result["capacity"] == 64 and result["open"] <= 64
    assert result["opened"] > 1000  # every shard, and some again after eviction
    assert "out of file descriptors (limit 128" in result["error"] and "ulimit -n" in result["error"]
