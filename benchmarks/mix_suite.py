"""mixing: cachekit.mix, the shares it draws and how fast it reads.

mixing  Two sources of ImageNet's sizes (1.28M and 300k samples, weights 0.7 / 0.3): each source's
        share of the first ``--mix-draws`` draws of an epoch and its worst batch; then two pixel
        caches built from ``--images`` synthetic JPEGs each, read alone and mixed 0.7 / 0.3 by
        make_loader, in turn (median of per-round ratios to the slower source alone)
"""

from __future__ import annotations

import statistics

import numpy as np
from feed_suites import _pass
from registry import suite, synthetic_raw

from cachekit import BuildConfig, CachedDataset, build, make_loader, mix
from cachekit.feed.mixorder import Source, mixed_order


def _shares(args) -> dict:
    sizes, weights = (1_281_167, 300_000), (0.7, 0.3)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    sources = [Source(s, np.array([*range(0, n, 1000), n]), 16_384, True) for s, n in zip(starts, sizes)]
    order = mixed_order(sources, weights, sum(sizes), seed=0, epoch=0)[: args.mix_draws]
    second = order >= sizes[0]
    batches = second[: len(second) // args.batch_size * args.batch_size].reshape(-1, args.batch_size).mean(1)
    out = {
        "draws": len(order),
        "share_0": float(1 - second.mean()),
        "share_1": float(second.mean()),
        "worst_batch_share_1": float(np.abs(batches - weights[1]).max() + weights[1]),
    }
    print(
        f"{len(order):,} draws, weights 0.7 / 0.3: shares {out['share_0']:.4f} / {out['share_1']:.4f}; "
        f"batches of {args.batch_size}: the second source's share at most {out['worst_batch_share_1']:.3f}"
    )
    return out


@suite
def mixing(args, root):
    shares = _shares(args)
    caches = []
    for k in range(2):
        raw = synthetic_raw(args, root, name=f"mix{k}")
        cache = root / f"mixing-{raw.name}"
        if not cache.is_dir():
            build(raw, cache, BuildConfig(progress=False))
        caches.append(CachedDataset(cache))
    loaders = {
        "first alone": make_loader(caches[0], args.batch_size),
        "second alone": make_loader(caches[1], args.batch_size),
        "mix 0.7 / 0.3": make_loader(  # passes as long as one source alone: the same fixed costs
            mix(caches, weights=[0.7, 0.3], samples_per_epoch=len(caches[0])), args.batch_size
        ),
    }
    for loader in loaders.values():  # warm-up: the page cache holds both caches
        for _ in loader:
            pass
    runs = {name: [] for name in loaders}
    for _ in range(args.repeats):
        for name, loader in loaders.items():
            runs[name].append(_pass(loader)[0])
    ratios = [m / min(a, b) for a, b, m in zip(*runs.values())]
    rows = {name: statistics.median(r) for name, r in runs.items()}
    for name, rate in rows.items():
        print(f"{name}: {rate:,.0f} samples/s")
    ratio = statistics.median(ratios)
    print(f"mixed / the slower source alone: {ratio:.2f}x (median of per-round ratios)")
    return {"shares": shares, "samples_per_s": rows, "ratio_to_slower": ratio}
