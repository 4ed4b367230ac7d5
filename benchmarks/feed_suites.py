"""Read-path suites: augmentation at read time, encoded stores in-process, class mix, FFCV side by side.

feed    RandomResizedCrop(224) + flip from a train-256 pixel cache: make_loader(augment=...) in this
        process vs a per-sample OpenCV transform in a plain 2-worker DataLoader; samples/s and CPU use
jpeg    a --store jpeg cache: decoded by threads in the training process vs worker processes
ffcv    FFCV 1.0.2's RandomResizedCropRGBImageDecoder + flip on the same images (needs --ffcv-python)

(stream: stream_suite.py; mixing: mix_suite.py)
"""

from __future__ import annotations

import os
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


def _train256(args, root: Path, store: str = "pixels") -> Path:
    """The benchmark images stored with their shorter side at 256 (``store``: planes or channels-last)."""
    raw = synthetic_raw(args, root)
    cache = root / (f"train256-{raw.name}" if store == "pixels" else f"train256-{store}-{raw.name}")
    if not cache.is_dir():
        build(raw, cache, BuildConfig(pipeline="train-256", store=store, progress=False))
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
    steps = [RandomResizedCrop(224), RandomHorizontalFlip()]
    loader = make_loader(ds, args.batch_size, augment=steps, threads=2)
    # FFCV hands out NHWC batches: the same layout from a channels-last cache
    nhwc = make_loader(_train256(args, root, "pixels-hwc"), args.batch_size, augment=steps, threads=2,
                       channels_last=True)  # fmt: skip
    for _ in loader:  # warm-up
        pass
    for _ in nhwc:
        pass
    theirs_runs, ours_runs, nhwc_runs = [], [], []
    for _ in range(args.repeats):  # in turn, so that a slow spell of the machine hits both
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        theirs_runs.append(float(out.strip().splitlines()[-1].split()[0]))
        ours_runs.append(_pass(loader))
        nhwc_runs.append(_pass(nhwc))
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
    nhwc_rate = statistics.median(r for r, _ in nhwc_runs)
    nhwc_ratio = statistics.median(o[0] / t for o, t in zip(nhwc_runs, theirs_runs))
    print(f"the same over --store pixels-hwc, channels_last=True (NHWC, as FFCV's): {nhwc_rate:,.0f} samples/s, "
          f"{nhwc_ratio:.2f}x FFCV (rounds: {', '.join(f'{o[0] / t:.2f}' for o, t in zip(nhwc_runs, theirs_runs))})")  # fmt: skip
    return {
        "ffcv_samples_per_s": theirs,
        "ours": ours,
        "ratio": ratio,
        "ours_nhwc": nhwc_rate,
        "ratio_nhwc": nhwc_ratio,
        "python": sys.version,
    }
