"""Benchmarks behind every figure in README: a registry of suites, each printing its figures.

    python benchmarks/run.py SUITE [SUITE ...] [--images N] [--json out.json] [--workdir DIR]
    python benchmarks/run.py all --images 2000

Suites (sizes are flags; defaults fit a 2-core laptop in a few minutes):
  load    load samples/s vs workers for raw PIL, raw OpenCV and each cache format (cachekit bench)
  build   build images/s vs worker processes, with scaling efficiency
  decode  the per-image build path in one process: PIL vs OpenCV exact vs OpenCV --fast-decode,
          img/s and pixel difference, for ImageNet-sized and for large photos
  augment offline augmentation per core: cachekit's batched flip + colour jitter (and its per-image
          crop) against a per-image PIL implementation of the same transforms
  size    cache size vs raw size, and load samples/s, for each format, codec and store
  mix     an ImageNet-sized shuffled plan (1.28M paths, 1,000 classes): planning time, shard sizes,
          and distinct classes per shard against a uniform draw
  rss     DataLoader worker memory over 10k- and 100k-sample caches (no copy-on-read growth)
  feed, jpeg, ffcv   the read path (augmentation at read time, encoded stores, FFCV): feed_suites.py
  detect, ceiling   detection feeds (letterbox + flip with boxes) against per-sample loaders, the cost
          of boxes, and antialiased crops against a bare memory map + threads: detect_suites.py
  deit, yolo   whole recipes (DeiT: crop, flip, RandAugment, erasing, MixUp/CutMix; YOLO: mosaic,
          affine, HSV, flip with boxes) through make_loader against the same per sample in 2 workers,
          and yolo against real Ultralytics with --ultralytics-python: recipe_suites.py
  floors, parent   RRC+flip, DeiT and YOLO through make_loader against their bare kernels in one loop
          (1 thread), and against another checkout's make_loader (--parent-tree): recipe_floors.py
  stream  a cache on throttled loopback S3: first batch, waiting, downloads, a tight limit: stream_suite.py
  mixing  cachekit.mix: each source's share of the draws, mixed read speed against each alone: mix_suite.py
  listing a raw folder on (loopback) object storage listed for a build: time and peak memory: listing_suite.py
  sources builds from Parquet, tars and a Python dataset of JPEGs against a folder, per core: sources_suite.py
  scale   a cache of millions of tiny samples (index and manifest synthesised): open, one rank's order: scale_suite.py

Every figure is a median (or best) over repeats inside one run and is printed with the command
that reproduced it; ratios, not absolute numbers, are what carry over to other machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from registry import SUITES, suite
from registry import synthetic_raw as _raw

from cachekit import BuildConfig, CachedDataset, build
from cachekit.build.inputs import decode_input
from cachekit.cpus import available_cpus
from cachekit.image.recipes import load_pipeline
from cachekit.tools.baselines import pil_classification
from cachekit.tools.bench import BenchConfig, format_table, run_bench
from cachekit.tools.doctor import child_pids


def _cache(raw: Path, root: Path, fmt: str, compression: str = "none") -> Path:
    out = root / f"cache-{raw.name}-{fmt}-{compression}"
    build(raw, out, BuildConfig(format=fmt, compression=compression, progress=False))
    return out


@suite
def load(args, root):
    raw = _raw(args, root)
    caches = [_cache(raw, root, "pt"), _cache(raw, root, "hdf5")]
    config = BenchConfig(batch_size=args.batch_size, workers=(0, 1, 2), epochs=3)
    result = run_bench(raw, caches, config, log=lambda line: print(line, file=sys.stderr))
    print(format_table(result))
    return result


@suite
def build_scaling(args, root):
    raw = _raw(args, root)
    rows = []
    for workers in sorted({1, 2, available_cpus()}):
        times = []
        for rep in range(args.repeats):
            out = root / f"scaling-{workers}-{rep}"
            t0 = time.perf_counter()
            build(raw, out, BuildConfig(workers=workers, progress=False))
            times.append(time.perf_counter() - t0)
            shutil.rmtree(out)
        rows.append({"workers": workers, "seconds": statistics.median(times), "images": args.images})
    base = rows[0]["seconds"]
    for r in rows:
        r["images_per_s"] = r["images"] / r["seconds"]
        r["speedup"] = base / r["seconds"]
        r["efficiency"] = r["speedup"] / r["workers"]
        print(
            f"build, {r['workers']} workers: {r['images_per_s']:.0f} images/s, "
            f"speed-up {r['speedup']:.2f}x, efficiency {r['efficiency']:.0%}"
        )
    return {"rows": rows}


SUITES["build"] = SUITES.pop("build_scaling")


def _time_per_image(fn, files: list[bytes | Path], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f in files:
            fn(f)
        best = min(best, time.perf_counter() - t0)
    return len(files) / best


@suite
def decode_path(args, root):
    cv2.setNumThreads(1)  # one core, as in a build worker
    pipeline = load_pipeline("classification-224")
    out = {}
    for label, size, n in (("imagenet-500x375", (375, 500), 200), ("photo-1500x2000", (1500, 2000), 40)):
        raw = _raw(args, root, n=n, size=size, name="decode")
        paths = sorted(raw.rglob("*.jpg"))
        blobs = [p.read_bytes() for p in paths]
        exact = [pipeline.apply(decode_input(b, pipeline))[0] for b in blobs]
        fast = [pipeline.apply(decode_input(b, pipeline, fast_decode=True))[0] for b in blobs]
        pil = [pil_classification(p, 256, 224) for p in paths]
        diff_fast = [np.abs(a.astype(int) - b.astype(int)) for a, b in zip(exact, fast)]
        diff_pil = [np.abs(a.astype(int) - b.astype(int)) for a, b in zip(exact, pil)]
        row = {
            "pil_images_per_s": _time_per_image(
                lambda p: pil_classification(p, 256, 224), paths, args.repeats
            ),
            "opencv_images_per_s": _time_per_image(
                lambda b: pipeline.apply(decode_input(b, pipeline)), blobs, args.repeats
            ),
            "fast_decode_images_per_s": _time_per_image(
                lambda b: pipeline.apply(decode_input(b, pipeline, fast_decode=True)), blobs, args.repeats
            ),
            "fast_decode_mean_abs_diff": float(np.mean([d.mean() for d in diff_fast])),
            "fast_decode_max_abs_diff": int(max(d.max() for d in diff_fast)),
            "pil_vs_opencv_mean_abs_diff": float(np.mean([d.mean() for d in diff_pil])),
        }
        row["opencv_over_pil"] = row["opencv_images_per_s"] / row["pil_images_per_s"]
        row["fast_decode_speedup"] = row["fast_decode_images_per_s"] / row["opencv_images_per_s"]
        out[label] = row
        print(
            f"{label}: PIL {row['pil_images_per_s']:.0f} img/s, OpenCV {row['opencv_images_per_s']:.0f} img/s "
            f"({row['opencv_over_pil']:.2f}x PIL), --fast-decode {row['fast_decode_images_per_s']:.0f} img/s "
            f"({row['fast_decode_speedup']:.2f}x, mean |diff| {row['fast_decode_mean_abs_diff']:.2f}, "
            f"max {row['fast_decode_max_abs_diff']})"
        )
    return out


SUITES["decode"] = SUITES.pop("decode_path")


def _pil_augment(img, p, out_hw):
    from PIL import Image, ImageEnhance

    im = Image.fromarray(img).crop((p.left, p.top, p.left + p.width, p.top + p.height))
    im = im.resize(out_hw[::-1], Image.BILINEAR)
    if p.flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    im = ImageEnhance.Brightness(im).enhance(p.brightness)
    im = ImageEnhance.Contrast(im).enhance(p.contrast)
    im = ImageEnhance.Color(im).enhance(p.saturation)
    h, s, v = im.convert("HSV").split()
    shift = int(round(p.hue * 256))
    h = h.point(lambda x: (x + shift) % 256)
    return np.asarray(Image.merge("HSV", (h, s, v)).convert("RGB"))


@suite
def augment(args, root):
    from cachekit.build.offline_variants import AugmentConfig, colour_batch, crop_variant, variant_params

    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    from cachekit.tools.synthetic import synthetic_image

    sources = [synthetic_image(rng, 375, 500) for _ in range(32)]
    config = AugmentConfig(variants=4, seed=0)
    params = [variant_params(config, i, v, 375, 500) for i in range(len(sources)) for v in range(4)]
    pairs = [(sources[i // 4], p) for i, p in enumerate(params)]

    def ours():
        crops = np.stack([crop_variant(img, p, (224, 224)) for img, p in pairs])
        return colour_batch(crops, params)

    crops = np.stack([crop_variant(img, p, (224, 224)) for img, p in pairs])
    timings = {}
    for name, fn in (
        ("cachekit crop + batched colour", ours),
        ("cachekit batched colour only", lambda: colour_batch(crops, params)),
        ("PIL per image", lambda: [_pil_augment(img, p, (224, 224)) for img, p in pairs]),
    ):
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        timings[name] = len(pairs) / best
        print(f"{name}: {timings[name]:.0f} images/s on one core")
    timings["speedup_over_pil"] = timings["cachekit crop + batched colour"] / timings["PIL per image"]
    print(f"cachekit / PIL: {timings['speedup_over_pil']:.2f}x")
    return timings


@suite
def size(args, root):
    """Cache size and warm load samples/s (make_loader defaults) for every format, codec and store."""
    from cachekit import make_loader

    raw = _raw(args, root)
    raw_bytes = sum(p.stat().st_size for p in raw.rglob("*") if p.is_file())
    rows = [{"cache": "raw JPEG folder", "bytes": raw_bytes}]
    cases = [
        ("pt", "none", "pixels"),
        ("hdf5", "none", "pixels"),
        ("hdf5", "gzip", "pixels"),
        ("hdf5", "lzf", "pixels"),
        ("zarr", "none", "pixels"),
        ("zarr", "lz4", "pixels"),
        ("zarr", "zstd", "pixels"),
        ("zarr", "gzip", "pixels"),
        ("pt", "none", "jpeg"),
        ("pt", "none", "png"),
    ]
    for fmt, codec, store in cases:
        out = root / f"codec-{raw.name}-{fmt}-{codec}-{store}"
        build(raw, out, BuildConfig(format=fmt, compression=codec, store=store, progress=False))
        ds = CachedDataset(out)
        loader = make_loader(ds, args.batch_size, seed=0)
        rates = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            n = sum(len(labels) for _, labels in loader)
            rates.append(n / (time.perf_counter() - t0))
        rows.append(
            {
                "cache": f"{fmt} {codec} {store}",
                "bytes": ds.manifest.total_bytes,
                "samples_per_s": statistics.median(rates),
                "mode": loader.mode,
            }
        )
    for r in rows:
        r["ratio_to_raw"] = r["bytes"] / raw_bytes
        speed = f", {r['samples_per_s']:,.0f} samples/s ({r['mode']})" if "samples_per_s" in r else ""
        print(f"{r['cache']}: {r['bytes'] / 1e6:.1f} MB ({r['ratio_to_raw']:.2f}x raw){speed}")
    return {"rows": rows}


@suite
def mix(args, root):
    from cachekit.build.shardplan import plan
    from cachekit.build.sources import Source

    n, classes, shard_size = 1_281_167, 1000, 890
    per = -(-n // classes)
    paths = tuple(f"n{c:08d}/n{c:08d}_{i}.JPEG" for c in range(classes) for i in range(per))[:n]
    labels = np.repeat(np.arange(classes), per)[:n]
    source = Source(
        root="/raw",
        layout="imagefolder",
        paths=paths,
        labels=labels,
        sizes=np.full(n, 110_000),
        mtimes=np.full(n, 1_700_000_000 * 10**9),
        classes=tuple(str(c) for c in range(classes)),
    )
    shards = -(-n // shard_size)
    t0 = time.perf_counter()
    planned = plan(source, {"kind": "shuffled", "seed": 0, "shards": shards}, shard_size, "0" * 64, ".pt")
    seconds = time.perf_counter() - t0
    sizes = [len(p.rows) for p in planned]
    distinct = [len(np.unique(labels[p.rows])) for p in planned[:200]]
    rng = np.random.default_rng(0)
    uniform = [len(np.unique(rng.integers(0, classes, shard_size))) for _ in range(200)]
    row = {
        "inputs": n,
        "shards": len(planned),
        "plan_seconds": seconds,
        "shard_min": min(sizes),
        "shard_max": max(sizes),
        "distinct_classes_per_shard": float(np.mean(distinct)),
        "uniform_draw": float(np.mean(uniform)),
    }
    print(
        f"shuffled plan of {n} inputs into {len(planned)} shards: {seconds:.1f} s; shards of "
        f"{min(sizes)}-{max(sizes)} inputs; {row['distinct_classes_per_shard']:.0f} distinct classes per "
        f"shard (a uniform draw of {shard_size}: {row['uniform_draw']:.0f}; sorted order: 1-2)"
    )
    return row


def _memory(pid: int) -> dict:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
            fields[key] = int(value.split()[0]) * 1024
    fields["Private"] = fields.pop("Private_Clean", 0) + fields.pop("Private_Dirty", 0)
    return fields


@suite
def rss(args, root):
    """Worker memory while a 2-worker DataLoader reads a whole epoch of 10k and 100k tiny samples."""
    from torch.utils.data import DataLoader

    from cachekit.feed.batch import collate_batch
    from cachekit.tools.synthetic import write_synthetic_cache

    out = {}
    for n in args.rss_samples:
        cache = root / f"rss-{n}"
        if not cache.is_dir():
            write_synthetic_cache(cache, n, side=16, shard_size=1000)
        ds = CachedDataset(cache)
        loader = DataLoader(
            ds, batch_size=256, shuffle=True, num_workers=2, persistent_workers=True, collate_fn=collate_batch
        )
        it = iter(loader)
        next(it)
        before = {pid: _memory(pid) for pid in child_pids()}
        for _ in it:
            pass
        after = {pid: _memory(pid) for pid in child_pids() if pid in before}
        rows = []
        for pid in after:
            rows.append(
                {key: after[pid][key] for key in after[pid]}
                | {"growth_private": after[pid]["Private"] - before[pid]["Private"]}
            )
        out[str(n)] = rows
        growth = max(r["growth_private"] for r in rows) / 1e6
        rss_mb = max(r["Rss"] for r in rows) / 1e6
        print(f"{n} samples: worker RSS {rss_mb:.0f} MB, private growth over the epoch {growth:.1f} MB")
        del it, loader
    return out


import detect_suites  # noqa: E402,F401  (registers detect, ceiling)
import feed_suites  # noqa: E402,F401  (registers the read-path suites: feed, jpeg, ffcv)
import listing_suite  # noqa: E402,F401  (registers listing)
import mix_suite  # noqa: E402,F401  (registers mixing)
import recipe_floors  # noqa: E402,F401  (registers floors, parent)
import recipe_suites  # noqa: E402,F401  (registers deit, yolo)
import scale_suite  # noqa: E402,F401  (registers scale)
import sources_suite  # noqa: E402,F401  (registers sources)
import stream_suite  # noqa: E402,F401  (registers stream)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="+", help=f"{', '.join(SUITES)} or all")
    parser.add_argument("--images", type=int, default=1000, help="synthetic JPEGs for load/build/size")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rss-samples", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--ffcv-python", default=None, help="ffcv suite: an interpreter that can import ffcv")
    parser.add_argument(
        "--ultralytics-python",
        default=None,
        help="yolo suite: an interpreter that can import ultralytics (also times its YOLODataset)",
    )
    parser.add_argument(
        "--parent-tree",
        default=None,
        help="parent suite: another checkout whose make_loader runs the same recipes (git worktree add)",
    )
    parser.add_argument("--latency-ms", type=float, default=20.0, help="stream suite: per-request latency")
    parser.add_argument("--link-mb-s", type=float, default=200.0, help="stream suite: the link's MB/s")
    parser.add_argument("--step-ms", type=float, default=100.0, help="stream suite: simulated step per batch")
    parser.add_argument("--stream-shard-sizes", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument(
        "--window",
        type=int,
        default=None,
        help="stream suite: samples shuffled together (default: make_loader's)",
    )
    parser.add_argument(
        "--limit-mb",
        type=float,
        default=None,
        help="stream suite: the node cache's limit (default: cachekit's)",
    )
    parser.add_argument(
        "--tight-shard-sizes",
        type=int,
        nargs="*",
        default=[128],
        help="stream suite: shard sizes also run with the node cache limited to a third of the cache",
    )
    parser.add_argument(
        "--mix-draws", type=int, default=100_000, help="mixing suite: draws checked for shares"
    )
    parser.add_argument(
        "--listing-objects", type=int, nargs="+", default=[10_000, 100_000], help="listing suite: objects"
    )
    parser.add_argument(
        "--listing-find-max",
        type=int,
        default=100_000,
        help="listing suite: largest listing also done by fs.find",
    )
    parser.add_argument(
        "--scale-samples", type=int, nargs="+", default=[200_000, 2_000_000], help="scale suite: samples"
    )
    parser.add_argument(
        "--scale-plan-paths", type=int, nargs="*", default=[1_000_000], help="scale suite: paths to plan"
    )
    parser.add_argument(
        "--scale-whole-max",
        type=int,
        default=2_000_000,
        help="scale suite: largest N whose whole order is timed",
    )
    parser.add_argument("--scale-per-shard", type=int, default=66, help="scale suite: samples a shard")
    parser.add_argument(
        "--scale-share", type=int, default=3125, help="scale suite: one rank's samples at a fixed share"
    )
    parser.add_argument("--json", default=None, help="write every figure here")
    parser.add_argument("--workdir", default=None, help="keep generated data here between runs")
    args = parser.parse_args()
    names = list(SUITES) if args.suites == ["all"] else args.suites
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {unknown}; choose from {', '.join(SUITES)}")
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="cachekit-benchmarks-"))
    root.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:])
    results = {"command": command, "cpus": available_cpus(), "suites": {}}
    try:
        for name in names:
            print(f"== {name}")
            results["suites"][name] = SUITES[name](args, root)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    print(f"reproduce with: {command}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
