"""``cachekit bench``: the raw folder (PIL, OpenCV) and each cache, loaded side by side in one run.

Every loader reads the same samples in the same shuffled order with the same batch size and worker
count, except the "make_loader" row, which is the cache through ``make_loader``'s defaults (its own
shard-aware shuffle over the same number of samples): the setting a user gets without tuning.
Epoch 1 starts from a cold page cache where the OS allows dropping it; later epochs are warm.
"""

from __future__ import annotations

import gc
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from ..constants import VERSION
from ..cpus import available_cpus
from ..errors import UsageError
from ..feed.batch import collate_batch
from ..feed.dataset import CachedDataset
from ..feed.loader import make_loader
from ..store.atomic import path_size
from .baselines import RawImageDataset
from .report import human_bytes

__all__ = [
    "BenchConfig",
    "run_bench",
    "bench_synthetic",
    "format_table",
    "plot_result",
    "memcpy_bandwidth",
    "drop_page_cache",
]


@dataclass(frozen=True)
class BenchConfig:
    batch_size: int = 256
    workers: tuple[int, ...] = (0, 2)
    samples: int | None = None  # None: every sample
    epochs: int = 2
    seed: int = 0
    cold: bool = True  # drop the files from the page cache before epoch 1
    raw_backends: tuple[str, ...] = ("pil", "opencv")


def drop_page_cache(files: Iterable[Path]) -> bool:
    """Ask the OS to forget the files' cached pages (``posix_fadvise(DONTNEED)``); False if it can't."""
    if not hasattr(os, "posix_fadvise"):
        return False
    ok = True
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            ok = False
            continue
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


def memcpy_bandwidth(nbytes: int = 256 * 1024 * 1024, repeats: int = 5) -> float:
    """Bytes per second one core copies between two large buffers (best of ``repeats``)."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def _files(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


def _epoch(loader, limit: int) -> dict:
    """Time one pass that delivers ``limit`` samples: total seconds and time to the first batch."""
    t0 = time.perf_counter()
    first, samples, nbytes = None, 0, 0
    for images, labels in loader:
        if first is None:
            first = time.perf_counter() - t0
        samples += len(labels)
        nbytes += images.numel() * images.element_size()
        if samples >= limit:
            break
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": samples, "bytes": nbytes, "first_batch_s": first or seconds}


def _measure(
    name: str, workers: int | str, make: Callable, files: list[Path], config: BenchConfig, limit: int
):
    cold = drop_page_cache(files) if config.cold else False
    loader, extra = make()
    epochs = []
    for e in range(config.epochs):
        rec = _epoch(loader, limit)
        rec["epoch"] = e + 1
        rec["cold"] = cold and e == 0
        rec["samples_per_s"] = rec["samples"] / rec["seconds"]
        rec["MB_per_s"] = rec["bytes"] / rec["seconds"] / 1e6
        epochs.append(rec)
    dataset = loader.dataset
    del loader
    gc.collect()  # shut persistent workers down and unmap their files before the next row
    if isinstance(dataset, CachedDataset):
        dataset.close()
    warm = epochs[1:] or epochs
    samples_per_s = statistics.median(r["samples_per_s"] for r in warm)
    bytes_per_sample = epochs[0]["bytes"] / max(1, epochs[0]["samples"])
    return {
        "loader": name,
        "workers": workers,
        **extra,
        "samples_per_s": samples_per_s,
        "bytes_per_sample": bytes_per_sample,
        "MB_per_s": samples_per_s * bytes_per_sample / 1e6,
        "first_batch_s": epochs[0]["first_batch_s"],
        "epoch1_samples_per_s": epochs[0]["samples_per_s"],
        "epochs": epochs,
    }


def run_bench(
    raw: str | os.PathLike | None,
    caches: Sequence[str | os.PathLike],
    config: BenchConfig = BenchConfig(),
    *,
    log: Callable[[str], None] = lambda line: None,
) -> dict:
    """Measure every loader; return a JSON-able dict of the figures, the machine and the ratios."""
    if config.batch_size < 1 or config.epochs < 1:
        raise UsageError("--batch-size and --epochs must be at least 1")
    datasets = [CachedDataset(c) for c in caches]
    for path, d in zip(caches, datasets):
        if d.ragged:
            raise UsageError(f"{path}: its samples have different sizes; bench compares fixed-size caches")
    raw_ds = {b: RawImageDataset(raw, backend=b) for b in config.raw_backends} if raw is not None else {}
    lengths = [len(d) for d in [*datasets, *raw_ds.values()]]
    if not lengths:
        raise UsageError("nothing to benchmark: give a raw folder and/or caches")
    n = min([*lengths, config.samples or min(lengths)])
    order = np.random.default_rng(config.seed).permutation(min(lengths))[:n].tolist()

    def plain(open_dataset, workers, collate=None):
        extra = {"persistent_workers": True} if workers else {}
        kwargs = {"collate_fn": collate} if collate else {}
        return lambda: (
            DataLoader(
                open_dataset(), config.batch_size, sampler=order, num_workers=workers, **extra, **kwargs
            ),
            {},
        )

    rows = []

    def add(name, workers, make, files):
        log(f"{name}, workers={workers} ...")
        rows.append(_measure(name, workers, make, files, config, n))
        r = rows[-1]
        log(f"  {r['samples_per_s']:.0f} samples/s warm, first batch {r['first_batch_s']:.2f} s")

    for backend, ds in raw_ds.items():
        for w in config.workers:
            add(f"raw-{backend}", w, plain(lambda ds=ds: ds, w), [Path(p) for p in ds.paths])
    for path, ds in zip(caches, datasets):
        label = f"cache-{ds.manifest.format}:{Path(path).name}"
        files = _files(Path(path))
        # Each row opens the cache afresh (and closes it after), so no earlier row's memory map
        # keeps the files in the page cache when epoch 1 is meant to be cold.
        for w in config.workers:
            add(label, w, plain(lambda path=path: CachedDataset(path), w, collate_batch), files)

        def defaults(path=path):
            loader = make_loader(CachedDataset(path), config.batch_size, seed=config.seed)
            return loader, {"mode": loader.mode}

        add(label, "make_loader", defaults, files)

    baseline = _best(rows, "raw-pil") or _best(rows, "raw-opencv")
    for r in rows:
        r["speedup"] = r["samples_per_s"] / baseline["samples_per_s"] if baseline else None
    memcpy = memcpy_bandwidth()
    result = {
        "cachekit_version": VERSION,
        "config": asdict(config),
        "samples": n,
        "machine": {
            "cpus_usable": available_cpus(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "memcpy_MB_per_s": memcpy / 1e6,
        },
        "raw": {"path": str(raw), "bytes": path_size(Path(raw)), "files": lengths[-1]}
        if raw is not None
        else None,
        "caches": [
            {
                "path": str(p),
                "format": d.manifest.format,
                "bytes": d.manifest.total_bytes,
                "samples": len(d),
                "shape": list(d.sample_shape),
            }
            for p, d in zip(caches, datasets)
        ],
        "rows": rows,
        "baseline": {k: baseline[k] for k in ("loader", "workers", "samples_per_s")} if baseline else None,
        "ratios": _ratios(rows, baseline, memcpy),
    }
    for d in datasets:
        d.close()
    return result


def _best(rows: list[dict], loader: str) -> dict | None:
    found = [r for r in rows if r["loader"] == loader]
    return max(found, key=lambda r: r["samples_per_s"]) if found else None


def _ratios(rows: list[dict], baseline: dict | None, memcpy: float) -> dict:
    """The headline figures: cache via make_loader's defaults vs the baseline, and vs memcpy."""
    out = {}
    for r in rows:
        if r["workers"] == "make_loader":
            key = r["loader"]
            if baseline:
                out[f"{key} make_loader / {baseline['loader']} best"] = (
                    r["samples_per_s"] / baseline["samples_per_s"]
                )
            out[f"{key} make_loader / memcpy"] = r["MB_per_s"] * 1e6 / memcpy
    return out


def bench_synthetic(
    n: int,
    config: BenchConfig = BenchConfig(),
    *,
    workdir: str | os.PathLike | None = None,
    formats: Sequence[str] = ("pt", "hdf5", "zarr"),
    keep: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> dict:
    """Generate ``n`` ImageNet-like JPEGs, build a cache per format, and run the comparison."""
    from ..build.run import BuildConfig, build
    from .synthetic import make_synthetic_folder

    if n < 1:
        raise UsageError("--synthetic needs at least 1 image")
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="cachekit-bench-"))
    try:
        raw = root / "raw"
        if not raw.is_dir() or sum(1 for _ in raw.rglob("*.jpg")) != n:
            shutil.rmtree(raw, ignore_errors=True)
            log(f"writing {n} synthetic JPEGs (about 500x375) to {raw} ...")
            make_synthetic_folder(raw, n, classes=min(10, n))
        caches, builds = [], []
        for fmt in formats:
            out = root / f"cache-{fmt}"
            log(f"building the {fmt} cache ...")
            result = build(raw, out, BuildConfig(format=fmt, overwrite=True, progress=False))
            caches.append(out)
            builds.append(
                {
                    "format": fmt,
                    "status": result.status,
                    "seconds": result.seconds,
                    "images_per_s": result.manifest.num_samples / result.seconds,
                    "bytes": result.manifest.total_bytes,
                }
            )
        report = run_bench(raw, caches, config, log=log)
        report["builds"] = builds
        report["synthetic"] = {"images": n, "workdir": str(root), "kept": keep}
        return report
    finally:
        if not keep and not workdir:
            shutil.rmtree(root, ignore_errors=True)


def format_table(result: dict) -> str:
    """The figures as a plain-text table, one row per loader and worker setting."""
    head = ["loader", "workers", "epoch 1/s", "warm/s", "MB/s", "1st batch", "speed-up"]
    lines = []
    for r in result["rows"]:
        workers = r.get("mode", r["workers"]) if r["workers"] == "make_loader" else r["workers"]
        speed = f"{r['speedup']:.1f}x" if r.get("speedup") else "-"
        lines.append(
            [
                r["loader"],
                f"{'make_loader: ' if r['workers'] == 'make_loader' else ''}{workers}",
                f"{r['epoch1_samples_per_s']:.0f}",
                f"{r['samples_per_s']:.0f}",
                f"{r['MB_per_s']:.0f}",
                f"{r['first_batch_s']:.3f} s",
                speed,
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*row) for row in lines]
    m = result["machine"]
    out.append("")
    out.append(
        f"{result['samples']} samples, batch {result['config']['batch_size']}, "
        f"{m['cpus_usable']} usable CPUs, memcpy {m['memcpy_MB_per_s']:.0f} MB/s"
    )
    if result.get("raw"):
        out.append(f"raw:   {human_bytes(result['raw']['bytes'])} in {result['raw']['files']} files")
    for c in result["caches"]:
        out.append(f"cache: {human_bytes(c['bytes'])} ({c['format']}, {c['samples']} samples) {c['path']}")
    for key, value in result["ratios"].items():
        out.append(f"{key}: {value:.2f}")
    return "\n".join(out)


def plot_result(result: dict, path: str | os.PathLike) -> Path:
    """A PNG bar chart of warm samples/s per loader (log scale)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'cachekit[plot]'") from None
    rows = result["rows"]
    labels = [f"{r['loader']} ({r['workers']})" for r in rows]
    values = [r["samples_per_s"] for r in rows]
    colours = ["#c0504d" if r["loader"].startswith("raw") else "#4f81bd" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    ax.barh(labels[::-1], values[::-1], color=colours[::-1])
    ax.set_xscale("log")
    ax.set_xlabel("samples/s (warm epochs, log scale)")
    ax.set_title(f"cachekit bench: {result['samples']} samples, batch {result['config']['batch_size']}")
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v:,.0f}", va="center", fontsize=8)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
