"""stream: a cache on a throttled loopback S3 server, read through make_loader against a simulated step.

stream  For each shard size, on a cold node: the first batch against one shard's download alone (and
        the shards the first batch needs), the share of time spent waiting for data over the whole of
        epoch 1 (its start included) and over later epochs, downloads per epoch, the most bytes on the
        node. Then, with the node cache limited to a third of the cache, the downloads over the epochs
        against the fewest Belady's rule needs for the same order. Every row names its window and limit.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from registry import suite, synthetic_raw

from cachekit import BuildConfig, CachedDataset, build, make_loader
from cachekit.store.remote import filesystem
from cachekit.stream.eviction import fewest_downloads
from cachekit.stream.shardcache import NodeShardCache


def _throttle(fs_class, latency_s: float, bytes_per_s: float) -> None:
    """Every ranged GET of ``fs_class`` waits ``latency_s`` and shares a ``bytes_per_s`` link, as
    behind a throttling proxy: a response's bytes cross the link from when it was asked for (as the
    server produces them), one response after another."""
    original = fs_class.cat_file
    lock = threading.Lock()
    link_free = [time.monotonic()]

    def cat_file(self, path, start=None, end=None, **kwargs):
        asked = time.monotonic()
        data = original(self, path, start=start, end=end, **kwargs)
        with lock:  # the link carries one response after another
            begin = max(asked, link_free[0])
            link_free[0] = begin + len(data) / bytes_per_s
            done = link_free[0]
        time.sleep(max(0.0, done - time.monotonic()) + latency_s)
        return data

    fs_class.cat_file = cat_file


def _ranges_read_in_place() -> None:
    """moto answers a ranged GET by copying the whole object twice and slicing the copy, S3 by
    reading the range: a 2 MB piece of a 76 MB shard cost moto 150 MB of copies, on the training
    process's CPUs. Here a ranged GET copies only its range, so the figures measure the link."""
    import threading as _threading

    from moto.s3 import models, responses

    state = _threading.local()
    plain = models.FakeKey.value

    class _Range:
        def __init__(self, key) -> None:
            self.key = key

        def __len__(self) -> int:
            return self.key.size

        def __bool__(self) -> bool:
            return self.key.size > 0

        def __getitem__(self, part: slice) -> bytes:
            with self.key.lock:
                self.key._value_buffer.seek(part.start)
                return self.key._value_buffer.read(part.stop - part.start)

    def value(key):
        return _Range(key) if getattr(state, "ranged", False) else plain.fget(key)

    models.FakeKey.value = property(value, plain.fset)
    original = responses.S3Response.get_object

    def get_object(self):
        state.ranged = bool(self.headers.get("range"))
        try:
            return original(self)
        finally:
            state.ranged = False

    responses.S3Response.get_object = get_object


def _one_shard_alone(url: str, ds) -> float:
    """Seconds to download the cache's median shard alone into an empty node folder."""
    infos = sorted(ds.manifest.shards, key=lambda s: s.bytes)
    info = infos[len(infos) // 2]
    folder = tempfile.mkdtemp(prefix="cachekit-one-shard-")
    try:
        fs, root = filesystem(url, fresh=True)
        fs.info(f"{root}/manifest.json")  # a client that has connected, as the loader's has
        cache = NodeShardCache(folder, None, ds.manifest.fingerprint, info.bytes)
        t0 = time.perf_counter()
        cache.fetch(fs, root, info)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _watch(local: Path, most: list, stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for p in local.glob("*/*"):
            if p.name.startswith("shard-") or p.name.endswith(".part"):
                try:
                    total += p.stat().st_size
                except OSError:  # renamed or evicted while we looked
                    pass
        most[0] = max(most[0], total)
        time.sleep(0.01)


def _epochs(loader, ds, args) -> dict:
    """``args.repeats`` timed epochs: per epoch its wall time, the waits (the first batch's
    included), and the downloads so far."""
    epochs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        waits, it = [], iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            waits.append(time.perf_counter() - w0)
            time.sleep(args.step_ms / 1000)  # a GPU step: the Python thread waits, the GIL released
        order = np.searchsorted(ds.shard_offsets, loader.sampler.last_indices, side="right") - 1
        used = order[np.concatenate([[True], order[1:] != order[:-1]])].tolist()
        epochs.append(
            {
                "wall": time.perf_counter() - t0,
                "waits": waits,
                "downloads": len(ds._remote.cache.downloads()),
                "used": used,
            }
        )
    return epochs


def _row(url: str, local: Path, args, limit: int | None, label: str) -> dict:
    shutil.rmtree(local, ignore_errors=True)  # a cold node: every shard comes over the link
    ds = CachedDataset(url, local_cache=local, local_cache_bytes=limit)
    alone = _one_shard_alone(url, ds)
    loader = make_loader(ds, args.batch_size, seed=0, window=args.window)
    first_needs = len(
        set(
            (
                np.searchsorted(ds.shard_offsets, loader.sampler.indices()[: args.batch_size], side="right")
                - 1
            ).tolist()
        )
    )
    most, stop = [0], threading.Event()
    watcher = threading.Thread(target=_watch, args=(local, most, stop), daemon=True)
    watcher.start()
    try:
        epochs = _epochs(loader, ds, args)
    finally:
        stop.set()
        watcher.join()
    later = [e for e in epochs[1:]]
    shares = [sum(e["waits"]) / e["wall"] for e in epochs]
    sizes = {k: s.bytes for k, s in enumerate(ds.manifest.shards)}
    fewest = fewest_downloads([s for e in epochs for s in e["used"]], sizes, ds._remote.cache.max_bytes)
    row = {
        "case": label,
        "shard_samples": int(np.median(np.diff(ds.shard_offsets))),
        "shard_MB": statistics.median(s.bytes for s in ds.manifest.shards) / 1e6,
        "shards": ds.num_shards,
        "window": loader.sampler.window,
        "limit_MB": ds._remote.cache.max_bytes / 1e6,
        "one_shard_alone_s": alone,
        "first_batch_s": epochs[0]["waits"][0],
        "first_batch_over_one_shard": epochs[0]["waits"][0] / alone,
        "first_batch_needs_shards": first_needs,
        "waiting_share_epoch1": shares[0],
        "waiting_share_later": sum(sum(e["waits"]) for e in later) / sum(e["wall"] for e in later)
        if later
        else None,
        "downloads_epoch1": epochs[0]["downloads"],
        "downloads_later": epochs[-1]["downloads"] - epochs[0]["downloads"],
        "downloads": epochs[-1]["downloads"],
        "fewest_downloads": fewest,
        "peak_local_MB": most[0] / 1e6,
    }
    later_txt = f"{row['waiting_share_later']:.1%}" if later else "-"
    print(
        f"{label}: shards of {row['shard_samples']} samples ({row['shard_MB']:.1f} MB), window "
        f"{row['window']}, limit {row['limit_MB']:.0f} MB: first batch {row['first_batch_s']:.2f} s "
        f"({row['first_batch_over_one_shard']:.2f}x one shard alone, {alone:.2f} s; it needs "
        f"{first_needs} shard(s)); waiting {row['waiting_share_epoch1']:.1%} of epoch 1 (start included), "
        f"{later_txt} later; downloads {row['downloads_epoch1']} in epoch 1 and {row['downloads_later']} "
        f"later for {row['shards']} shards ({row['downloads'] / fewest:.2f}x the fewest, {fewest}); "
        f"peak {row['peak_local_MB']:.0f} MB on disk"
    )
    return row


_SERVER = r"""
import logging, sys
sys.path.insert(0, sys.argv[1])
from moto.server import ThreadedMotoServer
from stream_suite import _ranges_read_in_place

logging.getLogger("werkzeug").setLevel(logging.ERROR)
_ranges_read_in_place()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(*server.get_host_and_port(), flush=True)
sys.stdin.read()
server.stop()
"""


@suite
def stream(args, root):
    """Throttled loopback S3 (``--link-mb-s``, ``--latency-ms``), a ``--step-ms`` training step. The
    S3 server (moto) runs in a process of its own: its CPU time is not the training process's."""
    import subprocess
    import sys

    import s3fs

    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(Path(__file__).parent)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    host, port = server.stdout.readline().split()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )
    fs = s3fs.S3FileSystem(anon=False)
    fs.mkdir("bench")
    _throttle(s3fs.S3FileSystem, args.latency_ms / 1000, args.link_mb_s * 1e6)
    raw = synthetic_raw(args, root)
    limit = int(args.limit_mb * 1e6) if args.limit_mb else None
    rows = []
    try:
        for shard_size in args.stream_shard_sizes:
            cache = root / f"stream-{raw.name}-{shard_size}"
            if not cache.is_dir():
                build(raw, cache, BuildConfig(shard_size=shard_size, progress=False))
            fs.put(str(cache) + "/", f"bench/{cache.name}", recursive=True)
            url = f"s3://bench/{cache.name}"
            rows.append(_row(url, root / f"node-{cache.name}", args, limit, "fits"))
            if shard_size in args.tight_shard_sizes:
                third = sum(s.bytes for s in CachedDataset(cache).manifest.shards) // 3
                rows.append(_row(url, root / f"node-{cache.name}", args, third, "a third"))
    finally:
        server.stdin.close()
        server.wait(60)
    return {
        "rows": rows,
        "latency_ms": args.latency_ms,
        "link_MB_s": args.link_mb_s,
        "step_ms": args.step_ms,
        "batch_size": args.batch_size,
    }
