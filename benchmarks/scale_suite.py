"""scale: what a process pays for a cache's size, from 200k to millions of samples.

scale    a format 5 cache of N tiny samples (3x8x8) in N / --scale-per-shard shards, synthesised
         by ``tools/synthindex.py`` (the project's index writer and manifest; the shards themselves
         are not written: nothing here reads pixels). In a fresh process each: opening the dataset
         (time, RSS over the RSS after ``import cachekit``, what pickles to a worker), and the first
         epoch order of one rank (sampler made + ``indices()``: time and peak RSS over the open
         dataset's, then, traced again, the Python allocations' peak) for one rank of 64 and, at a fixed share per rank, one rank of
         N / --scale-share. The whole epoch's order (every rank's, what each rank computed before)
         is timed beside it. Then planning: N listed paths (the compact column a listing leaves,
         ImageFolder names, 1,000 a class) cut into shuffled shards of 1,000 and the cache's
         fingerprint, in a fresh process: time and peak RSS over the listing's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from registry import suite

_PLAN = r"""
import json, resource, sys, time
import numpy as np
from cachekit.build.sources.listing import PathColumn
from cachekit.build.shardplan import cache_fingerprint, plan
from cachekit.build.sources import Source

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

n, per = int(sys.argv[1]), 1000
lengths = np.full(n, len("n00000000/n00000000_00000000.JPEG"), dtype=np.int64)
offsets = np.concatenate([[0], np.cumsum(lengths)])
blob = np.empty(int(offsets[-1]), dtype=np.uint8)
for lo in range(0, n, 100_000):  # the listing's compact column, as discover leaves it
    part = b"".join(f"n{k // per:08d}/n{k // per:08d}_{k:08d}.JPEG".encode() for k in range(lo, min(n, lo + 100_000)))
    blob[offsets[lo] : offsets[lo] + len(part)] = np.frombuffer(part, dtype=np.uint8)
source = Source(root="s3://raw/imagenet", layout="imagefolder", paths=PathColumn(blob, offsets),
    labels=np.arange(n) // per, sizes=np.full(n, 110_000), mtimes=np.full(n, 1_700_000_000 * 10**9),
    classes=tuple(f"n{c:08d}" for c in range(-(-n // per))))
before = status("VmRSS")
t0 = time.perf_counter()
order = {"kind": "shuffled", "seed": 0, "shards": max(1, n // 1000)}
shards = plan(source, order, 1000, "0" * 64, ".pt")
cache_fingerprint("0" * 64, order, 1000, source)
print(json.dumps({"paths": n, "plan_s": time.perf_counter() - t0, "plan_rss_peak": status("VmHWM") - before,
    "listing_bytes": source.paths.nbytes + 24 * n, "shards": len(shards)}))
"""

_MEASURE = r"""
import json, pickle, sys, time, tracemalloc

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

import numpy as np
import cachekit
from cachekit import CachedDataset, ShardAwareDistributedSampler

root, world, rank, whole = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
base, anon, shared = status("VmRSS"), status("RssAnon"), status("RssFile") + status("RssShmem")
t0 = time.perf_counter()
ds = CachedDataset(root)
out = {"open_s": time.perf_counter() - t0, "open_rss": status("VmRSS") - base, "pickled": len(pickle.dumps(ds))}
out["open_rss_private"] = status("RssAnon") - anon  # this process's own memory
out["open_rss_shared"] = status("RssFile") + status("RssShmem") - shared  # mapped pages (the index), shared
opened, peak0 = status("VmRSS"), status("VmHWM")
t0 = time.perf_counter()
sampler = ShardAwareDistributedSampler(ds, world, rank, seed=1)
mine = sampler.indices()
out["order_s"] = time.perf_counter() - t0
out["order_rss_peak_over_open"] = max(0, status("VmHWM") - opened)
tracemalloc.start()  # again, traced (tracemalloc slows what it traces: not timed)
ShardAwareDistributedSampler(ds, world, rank, seed=1).indices()
out["order_python_peak"] = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
out["share"] = len(mine)
if whole:
    t0 = time.perf_counter()
    everything = sampler.order(0)
    out["whole_order_s"] = time.perf_counter() - t0
    out["whole_order_bytes"] = everything.nbytes
print(json.dumps(out))
"""


def _child(root, world: int, rank: int, whole: bool) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(root), str(world), str(rank), "1" if whole else "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    """Each figure's median over the repeats (fresh processes)."""
    keys = runs[0].keys()
    return {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in keys}


@suite
def scale(args, root):
    from cachekit.tools.synthindex import write_synthetic_index

    rows = []
    for n in args.scale_samples:
        shards = max(1, n // args.scale_per_shard)
        t0 = time.perf_counter()
        cache = write_synthetic_index(root / f"scale-{n}-{shards}", n, shards)
        written = time.perf_counter() - t0
        index = next(cache.glob("index-*.bin"))
        fixed_world = max(1, n // args.scale_share)
        for label, world in (
            ("1 of 64", 64),
            (f"1 of {fixed_world} (share {args.scale_share:,})", fixed_world),
        ):
            whole = label == "1 of 64" and n <= args.scale_whole_max
            runs = [_child(cache, world, world // 2, whole=whole) for _ in range(args.repeats)]
            row = {
                "samples": n,
                "shards": shards,
                "rank": label,
                "index_bytes": index.stat().st_size,
                "synthesis_s": written,
                **_best(runs),
            }
            rows.append(row)
            print(
                f"{n:,} samples, {shards:,} shards, index {row['index_bytes'] / 1e6:.1f} MB; open "
                f"{row['open_s'] * 1e3:.1f} ms, +{row['open_rss'] / 1e6:.1f} MB RSS ({row['open_rss_private'] / 1e6:.1f} MB "
                f"private, {row['open_rss_shared'] / 1e6:.1f} MB shared pages), {row['pickled']:,} B "
                f"pickled; order of rank {label}: {row['share']:,} samples in {row['order_s'] * 1e3:.1f} ms, "
                f"peak +{row['order_rss_peak_over_open'] / 1e6:.1f} MB RSS over the open dataset "
                f"(Python {row['order_python_peak'] / 1e6:.1f} MB)"
                + (
                    f"; the whole epoch's order: {row['whole_order_s'] * 1e3:.0f} ms, "
                    f"{row['whole_order_bytes'] / 1e6:.0f} MB"
                    if "whole_order_s" in row
                    else ""
                )
            )
    for n in args.scale_plan_paths:
        done = subprocess.run(
            [sys.executable, "-c", _PLAN, str(n)], capture_output=True, text=True, check=True
        )
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(
            f"planning {n:,} listed paths into {row['shards']:,} shards (+ the cache's fingerprint): "
            f"{row['plan_s']:.2f} s, peak RSS +{row['plan_rss_peak'] / 1e6:.0f} MB over the listing "
            f"({row['plan_rss_peak'] / n:.0f} B a path; the listing itself {row['listing_bytes'] / n:.0f} B a path)"
        )
    if len(args.scale_samples) > 1:
        opened = [r for r in rows if "open_s" in r]
        first, last = opened[0], opened[-2]  # one rank of 64, smallest and largest
        fixed_first, fixed_last = opened[1], opened[-1]
        print(
            f"from {first['samples']:,} to {last['samples']:,} samples: open x"
            f"{last['open_s'] / first['open_s']:.2f} time, x{max(1, last['open_rss']) / max(1, first['open_rss']):.2f} "
            f"RSS (x{max(1, last['open_rss_private']) / max(1, first['open_rss_private']):.2f} private); one rank at a fixed share: order x{fixed_last['order_s'] / fixed_first['order_s']:.2f} time, "
            f"x{fixed_last['order_python_peak'] / fixed_first['order_python_peak']:.2f} Python peak"
        )
    return {"rows": rows}
