"""Read-path suites: augmentation at read time, encoded stores in-process, class mix, FFCV side by side.

feed    RandomResizedCrop(224) + flip from a train-256 pixel cache: make_loader(augment=...) in this
        process vs a per-sample OpenCV transform in a plain 2-worker DataLoader; samples/s and CPU use
jpeg    a --store jpeg cache: decoded by threads in the training process vs worker processes
ffcv    FFCV 1.0.2's RandomResizedCropRGBImageDecoder + flip on the same images (needs --ffcv-python)
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from registry import suite, synthetic_raw
from torch.utils.data import DataLoader

from cachekit import BuildConfig, CachedDataset, build, collate_batch, make_loader
from cachekit.tools.baselines import OpenCVRandomResizedCropFlip
from cachekit.tools.counters import child_pids, process_counters
from cachekit.transforms import ColorJitter, RandomHorizontalFlip, RandomResizedCrop


def _cpu_now() -> float:
    """CPU seconds of this process (all its threads) and of its live children (worker processes)."""
    return time.process_time() + sum(process_counters(pid).cpu_s for pid in child_pids())


def _pass(loader) -> tuple[float, float]:
    """One timed pass: (samples/s, CPU seconds per wall second)."""
    t0, c0, n = time.perf_counter(), _cpu_now(), 0
    for batch in loader:
        n += len(batch[1])
    wall = time.perf_counter() - t0
    return n / wall, (_cpu_now() - c0) / wall


def _interleaved(loaders: dict, epochs: int) -> list[dict]:
    """A warm-up pass of each, then ``epochs`` rounds of one timed pass of each in turn.

    Interleaving keeps a slow spell of a shared machine from landing on one loader only; each row
    gets its median samples/s and CPU use, and ``ratio_to_first`` the median of its per-round ratio
    to the first loader (the fairest comparison when the machine's speed drifts).
    """
    for loader in loaders.values():
        for _ in loader:
            pass
    runs: dict[str, list] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():
            runs[name].append(_pass(loader))
    first = next(iter(runs.values()))
    rows = []
    for name, passes in runs.items():
        row = {
            "loader": name,
            "samples_per_s": statistics.median(r for r, _ in passes),
            "cpu_per_wall": statistics.median(c for _, c in passes),
            "ratio_to_first": statistics.median(a[0] / b[0] for a, b in zip(passes, first)),
        }
        print(f"{name}: {row['samples_per_s']:,.0f} samples/s, {row['cpu_per_wall']:.2f} CPU s per wall s")
        rows.append(row)
    return rows


def _train256(args, root: Path) -> Path:
    raw = synthetic_raw(args, root)
    cache = root / f"train256-{raw.name}"
    if not cache.is_dir():
        build(raw, cache, BuildConfig(pipeline="train-256", progress=False))
    return cache


@suite
def feed(args, root):
    cache = _train256(args, root)
    ds = CachedDataset(cache)
    bs = args.batch_size
    per_sample = CachedDataset(cache, transform=OpenCVRandomResizedCropFlip(224))
    plain = DataLoader(
        per_sample, bs, shuffle=True, num_workers=2, persistent_workers=True, collate_fn=collate_batch
    )
    jittered = [RandomResizedCrop(224), RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1)]
    baseline, ours, jitter = _interleaved(
        {
            "DataLoader(2 workers, transform=OpenCV RandomResizedCrop + flip per sample)": plain,
            "make_loader(augment=[RandomResizedCrop(224), RandomHorizontalFlip()])": make_loader(
                ds, bs, augment=[RandomResizedCrop(224), RandomHorizontalFlip()]
            ),
            "  + ColorJitter(0.4, 0.4, 0.4, 0.1)": make_loader(ds, bs, augment=jittered),
        },
        args.repeats,
    )
    ratio = ours["ratio_to_first"]
    print(
        f"make_loader augment / per-sample transform in 2 workers: {ratio:.2f}x (median of per-round ratios)"
    )
    return {"rows": [ours, jitter, baseline], "ratio": ratio, "cache": str(cache), "samples": len(ds)}


@suite
def jpeg(args, root):
    raw = synthetic_raw(args, root)
    cache = root / f"jpeg-{raw.name}"
    if not cache.is_dir():
        build(raw, cache, BuildConfig(store="jpeg", progress=False))
    ds = CachedDataset(cache)
    workers, threads = _interleaved(
        {
            "make_loader(workers=2) (worker processes)": make_loader(ds, args.batch_size, workers=2),
            "make_loader defaults (threads decode in this process)": make_loader(ds, args.batch_size),
        },
        args.repeats,
    )
    ratio = threads["ratio_to_first"]
    print(f"in-process threads / worker processes: {ratio:.2f}x (median of per-round ratios)")
    return {"rows": [threads, workers], "ratio": ratio}


@suite
def ffcv(args, root):
    """FFCV on the very images of the train-256 cache, run by another interpreter that has ffcv."""
    if not args.ffcv_python:
        print("skipped: pass --ffcv-python /path/to/venv/bin/python (a venv with ffcv 1.0.2; see README)")
        return {"skipped": True}
    cache = _train256(args, root)
    ds = CachedDataset(cache)
    beton = root / f"ffcv-{cache.name}.beton"
    script = Path(__file__).with_name("ffcv_rrc.py")
    cmd = [args.ffcv_python, str(script), str(cache), str(beton), "--batch-size", str(args.batch_size)]
    cmd += ["--epochs", "1", "--threads", "2"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    }
    loader = make_loader(
        ds, args.batch_size, augment=[RandomResizedCrop(224), RandomHorizontalFlip()], threads=2
    )
    for _ in loader:  # warm-up
        pass
    theirs_runs, ours_runs = [], []
    for _ in range(args.repeats):  # in turn, so that a slow spell of the machine hits both
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        theirs_runs.append(float(out.strip().splitlines()[-1].split()[0]))
        ours_runs.append(_pass(loader))
    theirs = statistics.median(theirs_runs)
    ours = {
        "loader": "make_loader(augment=[RandomResizedCrop(224), RandomHorizontalFlip()]), 2 threads",
        "samples_per_s": statistics.median(r for r, _ in ours_runs),
        "cpu_per_wall": statistics.median(c for _, c in ours_runs),
    }
    ratio = statistics.median(o[0] / t for o, t in zip(ours_runs, theirs_runs))
    print(
        f"{ours['loader']}: {ours['samples_per_s']:,.0f} samples/s, {ours['cpu_per_wall']:.2f} CPU s per wall s"
    )
    print(f"FFCV RandomResizedCropRGBImageDecoder + RandomHorizontalFlip, 2 threads: {theirs:,.0f} samples/s")
    print(f"cachekit / FFCV: {ratio:.2f}x (median of per-round ratios)")
    return {"ffcv_samples_per_s": theirs, "ours": ours, "ratio": ratio, "python": sys.version}


def _throttle(fs_class, latency_s: float, bytes_per_s: float) -> None:
    """Every ranged GET of ``fs_class`` waits ``latency_s`` and shares a ``bytes_per_s`` link."""
    import threading

    original = fs_class.cat_file
    lock = threading.Lock()
    link_free = [time.monotonic()]

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = original(self, path, start=start, end=end, **kwargs)
        with lock:  # the link carries one response after another
            begin = max(time.monotonic(), link_free[0])
            link_free[0] = begin + len(data) / bytes_per_s
            done = link_free[0]
        time.sleep(max(0.0, done - time.monotonic()) + latency_s)
        return data

    fs_class.cat_file = cat_file


@suite
def stream(args, root):
    """A cache on a throttled loopback S3 server read through make_loader against a simulated step:
    share of time waiting for data in steady state, first-batch time, downloads and peak local bytes
    per shard size."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
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
    rows = []
    try:
        for shard_size in args.stream_shard_sizes:
            cache = root / f"stream-{raw.name}-{shard_size}"
            if not cache.is_dir():
                build(raw, cache, BuildConfig(shard_size=shard_size, progress=False))
            fs.put(str(cache) + "/", f"bench/{cache.name}", recursive=True)
            local = root / f"node-{cache.name}"
            shutil.rmtree(local, ignore_errors=True)  # a cold node: every shard comes over the link
            ds = CachedDataset(f"s3://bench/{cache.name}", local_cache=local)
            loader = make_loader(ds, args.batch_size, seed=0, window=args.window)
            rows.append(_stream_row(loader, ds, shard_size, local, args))
    finally:
        server.stop()
    return {
        "rows": rows,
        "latency_ms": args.latency_ms,
        "link_MB_s": args.link_mb_s,
        "step_ms": args.step_ms,
        "window": args.window,
    }


def _gpu_step(ms: float) -> None:
    time.sleep(ms / 1000)  # a GPU step: the Python thread waits on the device, the GIL released


def _stream_row(loader, ds, shard_size: int, local: Path, args) -> dict:
    import threading

    most, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            total = 0
            for p in local.glob("*/*"):
                if not p.name.endswith((".lock", ".log")):
                    try:
                        total += p.stat().st_size
                    except OSError:  # renamed or evicted while we looked
                        pass
            most[0] = max(most[0], total)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    waits: list[list[float]] = []
    first = None
    for _ in range(args.repeats):
        waits.append([])
        it = iter(loader)
        while True:
            w0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            if first is None:
                first = time.perf_counter() - t0
            else:
                waits[-1].append(time.perf_counter() - w0)
            _gpu_step(args.step_ms)
    stop.set()
    watcher.join()

    def share(ws: list[float]) -> float:
        ws = ws[len(ws) // 10 :]  # after the pipeline has filled
        total = sum(ws) + len(ws) * args.step_ms / 1000
        return sum(ws) / total if total else 0.0

    shard_mb = statistics.median(s.bytes for s in ds.manifest.shards) / 1e6
    row = {
        "shard_samples": shard_size,
        "shard_MB": shard_mb,
        "first_batch_s": first,
        "waiting_share_epoch1": share(waits[0]),
        "waiting_share_later": share([w for ws in waits[1:] for w in ws]),
        "downloads": len(ds._remote.cache.downloads()),
        "shards": ds.num_shards,
        "peak_local_MB": most[0] / 1e6,
    }
    print(
        f"shards of {shard_size} samples ({shard_mb:.1f} MB): first batch {first:.2f} s, waiting "
        f"{row['waiting_share_epoch1']:.1%} of epoch 1 (streaming) and {row['waiting_share_later']:.1%} later, "
        f"{row['downloads']} downloads for {row['shards']} shards, peak {row['peak_local_MB']:.0f} MB on disk"
    )
    return row
