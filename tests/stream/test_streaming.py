"""Caches on object storage at scale: worker processes (fork and spawn), one download per shard per node,
a byte limit that holds, downloads ahead, storage options that stay out of every file."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from cachekit import (
    BuildConfig,
    CachedDataset,
    CacheError,
    UsageError,
    build,
    collate_batch,
    make_loader,
    read_manifest,
)
from cachekit.store.atomic import path_size

s3fs = pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def s3_url(s3_endpoint, small_cache) -> str:
    fs = s3fs.S3FileSystem(anon=False)
    fs.put(str(small_cache) + "/", "datasets/stream", recursive=True)
    return "s3://datasets/stream"


def _labels(loader) -> list[int]:
    return sorted(int(y) for batch in loader for y in batch[1])


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_processes_read_an_s3_cache(s3_url, small_cache, tmp_path, context):
    expected = sorted(CachedDataset(small_cache).read_batch(range(40))[1].tolist())
    ds = CachedDataset(s3_url, local_cache=tmp_path / "lc")
    ds[0]  # the parent has used its filesystem: the workers must not reuse it
    plain = DataLoader(ds, 8, num_workers=2, collate_fn=collate_batch, multiprocessing_context=context)
    assert _labels(plain) == expected
    ours = make_loader(ds, 8, workers=2, multiprocessing_context=context)
    assert _labels(ours) == expected


def test_make_loader_defaults_on_an_s3_jpeg_cache(s3_endpoint, small_tree, tmp_path):
    build(small_tree, tmp_path / "j", BuildConfig(store="jpeg", size=32, workers=1, progress=False))
    s3fs.S3FileSystem(anon=False).put(str(tmp_path / "j") + "/", "datasets/jpeg", recursive=True)
    ds = CachedDataset("s3://datasets/jpeg", local_cache=tmp_path / "lc")
    loader = make_loader(ds, 8)
    assert loader.num_workers == 0 and len(_labels(loader)) == 40


def test_a_limit_below_one_shard_is_refused_at_once(s3_url, small_cache, tmp_path):
    largest = max(s.bytes for s in read_manifest(small_cache).shards)
    with pytest.raises(UsageError, match="largest shard"):
        CachedDataset(s3_url, local_cache=tmp_path / "lc", local_cache_bytes=largest - 1)


def _rank(rank, world, init_method, url, folder, limit, context, batch, results):
    import torch.distributed as dist
    from distgroup import join_group

    os.environ.update(LOCAL_WORLD_SIZE=str(world))
    join_group(rank, world, init_method)
    try:
        ds = CachedDataset(url, local_cache=folder, local_cache_bytes=limit)
        loader = make_loader(ds, batch, workers=2, multiprocessing_context=context, seed=1)
        seen = [y for _ in range(2) for _, labels in loader for y in labels.tolist()]
        results[rank] = (len(seen), ds._remote.cache.downloads())
    finally:
        dist.destroy_process_group()


def _run_ranks(url, folder, limit, context, batch=4) -> tuple[dict, int]:
    """Two ranks of two workers each over one node cache; returns results and the most bytes seen on disk."""
    import torch.multiprocessing as tmp_mp
    from distgroup import rendezvous

    init_method = rendezvous(Path(folder).parent)  # beside the node folder, never in it
    most, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                copies = [p for p in Path(folder).glob("*/shard-*")] + list(
                    Path(folder).glob("*/.shard-*.part")
                )
                most[0] = max(most[0], sum(path_size(p) for p in copies))  # shards and downloads
            except OSError:
                pass
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    results = tmp_mp.Manager().dict()
    try:
        tmp_mp.spawn(_rank, args=(2, init_method, url, str(folder), limit, context, batch, results), nprocs=2)
    finally:
        stop.set()
        watcher.join()
    return dict(results), most[0]


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_two_ranks_of_two_workers_download_each_shard_once(s3_url, small_cache, tmp_path, context):
    shards = read_manifest(small_cache).shards
    results, _ = _run_ranks(s3_url, tmp_path / "lc", None, context)
    assert {n for n, _ in results.values()} == {2 * 20}  # 40 samples over 2 ranks, 2 epochs
    downloads = results[0][1]
    assert sorted(downloads) == sorted(s.file for s in shards)  # one per shard, for the whole node


@pytest.mark.slow
def test_the_byte_limit_holds_under_ranks_and_workers(s3_endpoint, small_tree, tmp_path):
    config = BuildConfig(size=16, shard_size=2, order="sorted", workers=1, progress=False)  # 20 equal shards
    build(small_tree, tmp_path / "c", config)
    s3fs.S3FileSystem(anon=False).put(str(tmp_path / "c") + "/", "datasets/many", recursive=True)
    shards = read_manifest(tmp_path / "c").shards
    largest = max(s.bytes for s in shards)
    limit = 10 * largest  # half the 20 shards; 2 ranks x 2 workers hold at most 2 each at a time
    results, most = _run_ranks("s3://datasets/many", tmp_path / "lc", limit, "fork", batch=2)
    assert {n for n, _ in results.values()} == {40}
    assert most <= limit + largest  # never more than the limit plus the shard being fetched
    assert len(results[0][1]) > len(shards)  # it really evicted and fetched again


def test_storage_options_reach_fsspec_and_stay_out_of_every_file(s3_endpoint, s3_url, tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong")
    secret = "testing"  # moto accepts any secret; what matters is where it is written
    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": secret}
    ds = CachedDataset(s3_url, local_cache=tmp_path / "lc", storage_options=options)
    assert len(_labels(make_loader(ds, 8))) == 40
    for path in (tmp_path / "lc").rglob("*"):
        if path.is_file() and path.suffix != ".pt":
            assert s3_endpoint.encode() not in path.read_bytes()


def test_downloads_ahead_follow_the_sampler_order(s3_url, small_cache, tmp_path):
    ds = CachedDataset(s3_url, local_cache=tmp_path / "lc")
    loader = make_loader(ds, 4, seed=3)
    it = iter(loader)
    next(it)
    fetcher = ds._remote.fetcher(ds.shard_offsets)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(ds._remote.cache.downloads()) < min(
        fetcher.ahead, ds.num_shards
    ):
        time.sleep(0.05)
    order = np.searchsorted(ds.shard_offsets, loader.sampler.last_indices, side="right") - 1
    _, first = np.unique(order, return_index=True)
    upcoming = [ds.manifest.shards[s].file for s in order[np.sort(first)][: fetcher.ahead]]
    assert set(upcoming) <= set(ds._remote.cache.downloads())  # fetched before they were read
    assert not fetcher.errors
    del it


def test_verify_checks_a_cache_on_object_storage(s3_endpoint, small_cache):
    from cachekit.tools.verify import verify

    fs = s3fs.S3FileSystem(anon=False)
    fs.put(str(small_cache) + "/", "datasets/to-verify", recursive=True)
    assert verify("s3://datasets/to-verify").ok
    victim = read_manifest(small_cache).shards[2].file
    data = bytearray(fs.cat_file(f"datasets/to-verify/{victim}"))
    data[len(data) // 3] ^= 0x01  # one flipped bit, same size
    fs.pipe_file(f"datasets/to-verify/{victim}", bytes(data))
    assert verify("s3://datasets/to-verify", quick=True).ok  # sizes alone cannot see it
    report = verify("s3://datasets/to-verify")
    assert [p.file for p in report.problems] == [victim] and "sha256" in report.problems[0].problem


def test_waiting_for_a_download_never_waits_for_a_pin(s3_url, tmp_path):
    # Another process holds a shared pin on a shard that is not on the node yet (it saw it missing
    # and is about to wait for the download itself): fetching must not block on that pin.
    ds = CachedDataset(s3_url, local_cache=tmp_path / "lc")
    cache, info = ds._remote.cache, ds.manifest.shards[1]
    cache.folder.mkdir(parents=True, exist_ok=True)
    pin = os.open(cache.folder / f".{info.file}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(pin, fcntl.LOCK_SH)
    try:
        done = threading.Event()
        reader = threading.Thread(target=lambda: (ds[int(ds.shard_offsets[1])], done.set()), daemon=True)
        reader.start()
        assert done.wait(60), "reading a shard waited on another process's pin"
    finally:
        os.close(pin)


def test_the_node_cache_touches_only_its_own_files(s3_url, small_cache, tmp_path):
    root = tmp_path / "scratch"  # a user's scratch space, used as local_cache too
    (root / "my_project" / "results").mkdir(parents=True)
    (root / "my_project" / "thesis.tex").write_text("four years")
    (root / "my_project" / "results" / "shard-000001.pt").write_bytes(b"x" * 100_000)
    (root / "notes.txt").write_text("keep")
    largest = max(s.bytes for s in read_manifest(small_cache).shards)
    ds = CachedDataset(s3_url, local_cache=root, local_cache_bytes=3 * largest)
    assert len(_labels(make_loader(ds, 2, window=4))) == 40
    shards = len(read_manifest(small_cache).shards)
    assert len(ds._remote.cache.downloads()) == shards > 3  # through room for 3: evictions ran
    assert len(list(ds._remote.cache.folder.glob("shard-*"))) <= 3
    assert (root / "my_project" / "thesis.tex").read_text() == "four years"
    assert (root / "my_project" / "results" / "shard-000001.pt").stat().st_size == 100_000
    assert (root / "notes.txt").read_text() == "keep"
    shutil.rmtree(root / ds._remote.cache.folder.name)  # a temp cleaner removes the copies mid-training
    assert len(_labels(make_loader(ds, 2, window=4))) == 40


def test_a_shard_replaced_on_storage_is_refused_before_it_is_fetched(s3_endpoint, small_cache, tmp_path):
    fs = s3fs.S3FileSystem(anon=False)
    fs.put(str(small_cache) + "/", "datasets/replaced", recursive=True)
    info = read_manifest(small_cache).shards[0]
    fs.pipe(f"datasets/replaced/{info.file}", b"\0" * (50 * info.bytes))  # someone's other data
    ds = CachedDataset(
        "s3://datasets/replaced", local_cache=tmp_path / "lc", local_cache_bytes=4 * info.bytes
    )
    with pytest.raises(CacheError, match="manifest says"):
        ds[0]
    assert all(path_size(p) <= info.bytes for p in (tmp_path / "lc").rglob("*") if p.is_file())


def test_batches_that_cannot_fit_the_node_cache_are_refused_when_the_loader_is_made(
    s3_endpoint, small_tree, tmp_path
):
    build(
        small_tree,
        tmp_path / "c",
        BuildConfig(size=16, shard_size=2, order="sorted", workers=1, progress=False),
    )
    s3fs.S3FileSystem(anon=False).put(str(tmp_path / "c") + "/", "datasets/pure", recursive=True)
    largest = max(s.bytes for s in read_manifest(tmp_path / "c").shards)
    ds = CachedDataset("s3://datasets/pure", local_cache=tmp_path / "lc", local_cache_bytes=4 * largest)
    with pytest.raises(UsageError, match="shards at once"):
        make_loader(ds, 16)  # class-pure shards: batches draw from the whole cache, up to 16 shards
    assert len(_labels(make_loader(ds, 2))) == 40  # two shards a batch fit


def test_folder_shards_stream_and_verify_from_s3(s3_endpoint, mixed_tree, tmp_path):
    from cachekit.tools.verify import verify

    local = tmp_path / "z"
    build(mixed_tree, local, BuildConfig(format="zarr", size=32, shard_size=3, workers=1, progress=False))
    s3fs.S3FileSystem(anon=False).put(str(local) + "/", "datasets/zarr", recursive=True)
    ds = CachedDataset("s3://datasets/zarr", local_cache=tmp_path / "lc")
    expected = CachedDataset(local).read_batch(range(len(ds)))
    images, labels = ds.read_batch(range(len(ds)))
    assert torch.equal(images, expected[0]) and torch.equal(labels, expected[1])
    assert verify("s3://datasets/zarr").ok


def _node_rank(rank, world, local, init_method, url, root, epochs, results):
    import torch.distributed as dist
    from distgroup import join_group

    os.environ.update(LOCAL_WORLD_SIZE=str(local))
    join_group(rank, world, init_method)
    try:
        node = rank // local  # each simulated node has a node cache folder of its own
        ds = CachedDataset(url, local_cache=Path(root) / f"node{node}")
        loader = make_loader(ds, 4, seed=2)
        out = {"partitions": loader.sampler.partitions, "epochs": [], "downloads": []}
        for _ in range(epochs):
            labels = [int(y) for _, batch in loader for y in batch]
            assert len(labels) == len(loader.sampler.last_indices)
            out["epochs"].append(loader.sampler.last_indices.tolist())
            dist.barrier()  # every rank of the node has finished the epoch's downloads
            out["downloads"].append(len(ds._remote.cache.downloads()))
            dist.barrier()
        results[rank] = out
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_after_the_first_epoch_a_node_whose_partition_fits_downloads_nothing(mixed_s3_cache, tmp_path):
    import torch.multiprocessing as tmp_mp
    from distgroup import rendezvous

    url, local_cache = mixed_s3_cache
    offsets = CachedDataset(local_cache).shard_offsets
    results = tmp_mp.Manager().dict()
    world, local, epochs = 4, 2, 3  # two nodes of two ranks
    init_method = rendezvous(tmp_path)
    tmp_mp.spawn(
        _node_rank, args=(world, local, init_method, url, str(tmp_path), epochs, results), nprocs=world
    )
    got = [results[r] for r in range(world)]
    assert {g["partitions"] for g in got} == {2}
    for epoch in range(epochs):  # every sample exactly once an epoch (96 divides by 4 ranks)
        seen = sorted(i for g in got for i in g["epochs"][epoch])
        assert seen == list(range(96))
    for node in range(2):
        ranks = got[node * local : (node + 1) * local]
        read = [{i for g in ranks for i in g["epochs"][e]} for e in range(epochs)]
        assert read[0] == read[1] == read[2]  # the same samples every epoch
        shards = set((np.searchsorted(offsets, sorted(read[0]), side="right") - 1).tolist())
        downloads = ranks[0]["downloads"]
        assert downloads[0] == len(shards) < 12  # its partition's shards, once each
        assert downloads[1] == downloads[2] == downloads[0]  # and nothing after the first epoch


def _read_slowly(url: str, folder: str, started) -> None:
    """A reader on a slow link (a ranged GET of 4 KB every 50 ms) that will be killed mid-download."""
    import s3fs as s3

    from cachekit.store import remote
    from cachekit.stream import linkshare

    original = s3.S3FileSystem.cat_file

    def slow(self, path, start=None, end=None, **kwargs):
        time.sleep(0.05)
        return original(self, path, start=start, end=end, **kwargs)

    s3.S3FileSystem.cat_file = slow
    remote._PART, linkshare.BACKGROUND_PIECE_BYTES = 4096, 4096
    ds = CachedDataset(url, local_cache=folder)
    it = iter(make_loader(ds, 8, seed=1))
    started.set()
    for _ in it:
        pass


@pytest.mark.slow
def test_a_reader_killed_mid_download_leaves_nothing_in_the_way(mixed_s3_cache, tmp_path):
    import multiprocessing as mp
    import signal

    url, local = mixed_s3_cache
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    proc = ctx.Process(target=_read_slowly, args=(url, str(tmp_path / "lc"), started))
    proc.start()
    assert started.wait(120)
    deadline = time.monotonic() + 60  # downloading: a partial shard, its plan and its demand marks
    while time.monotonic() < deadline and not list((tmp_path / "lc").glob("*/.shard-*.part")):
        time.sleep(0.02)
    folder = next(p for p in (tmp_path / "lc").iterdir() if p.is_dir())
    assert list(folder.glob(".shard-*.part")) and list(folder.glob(".plan-*"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    ds = CachedDataset(url, local_cache=tmp_path / "lc")
    expected = sorted(CachedDataset(local).read_batch(range(96))[1].tolist())
    assert sorted(y for _, labels in make_loader(ds, 8, seed=2) for y in labels.tolist()) == expected
    assert not list(folder.glob(".shard-*.part"))  # the dead reader's partial download is gone
    plans = list(folder.glob(".plan-*"))
    assert len(plans) == 1 and str(os.getpid()) in plans[0].name  # and its plan: only ours is left
