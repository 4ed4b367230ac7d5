"""How bench times one row: its epochs (the first one cold, ``drop_page_cache``), the median of the warm
ones with their spread, and the machine's copy limit (``memcpy_bandwidth``) the figures are read against."""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import CachekitError
from ..feed.dataset import CachedDataset
from .benchview import workers_text

__all__ = ["drop_page_cache", "memcpy_bandwidth", "time_epoch", "measure"]


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


def time_epoch(loader, limit: int, bar) -> dict:
    """Time one pass that delivers ``limit`` samples: total seconds and time to the first batch."""
    t0 = time.perf_counter()
    first, samples, nbytes = None, 0, 0
    for images, labels in loader:
        if first is None:
            first = time.perf_counter() - t0
        samples += len(labels)
        nbytes += images.numel() * images.element_size()
        bar.update(len(labels))
        if samples >= limit:
            break
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "samples": samples, "bytes": nbytes, "first_batch_s": first or seconds}


def _one_line(exc: CachekitError) -> CachekitError:
    """A CachekitError raised in a DataLoader worker arrives wrapped in a traceback; keep its own line."""
    text = str(exc)
    if "Original Traceback" not in text:
        return exc
    last = [line for line in text.splitlines() if line.strip()][-1]
    return type(exc)(last.split(": ", 1)[1] if ": " in last else last)


def measure(
    name: str,
    workers: int | str,
    make: Callable,
    files: list[Path],
    *,
    passes: int,
    cold: bool,
    limit: int,
    progress: bool,
) -> dict:
    """Time one row: its loader (``make()``: the loader and what the row records of it) for
    ``passes`` epochs of ``limit`` samples, the first one ``cold`` (``files`` dropped from the page
    cache) where asked and possible; its figure is the median of the warm epochs."""
    dropped = drop_page_cache(files) if cold else False
    loader, extra = make()
    epochs = []
    desc = f"{name}, {workers_text({'workers': workers, **extra})}"
    with tqdm(total=passes * limit, unit="img", desc=desc, disable=not progress, leave=False) as bar:
        for e in range(passes):
            try:
                rec = time_epoch(loader, limit, bar)
            except CachekitError as exc:
                raise _one_line(exc) from None
            rec["epoch"] = e + 1
            rec["cold"] = dropped and e == 0
            rec["samples_per_s"] = rec["samples"] / rec["seconds"]
            rec["MB_per_s"] = rec["bytes"] / rec["seconds"] / 1e6
            epochs.append(rec)
    dataset = loader.dataset
    del loader
    gc.collect()  # shut persistent workers down and unmap their files before the next row
    if isinstance(dataset, CachedDataset):
        dataset.close()
    warm = [r["samples_per_s"] for r in epochs[1:] or epochs]
    samples_per_s = statistics.median(warm)
    bytes_per_sample = epochs[0]["bytes"] / max(1, epochs[0]["samples"])
    return {
        "loader": name,
        "workers": workers,
        **extra,
        "samples_per_s": samples_per_s,  # the median of the warm epochs
        "samples_per_s_min": min(warm),
        "samples_per_s_max": max(warm),
        "repeats": len(warm),
        "spread": (max(warm) - min(warm)) / samples_per_s,
        "bytes_per_sample": bytes_per_sample,
        "MB_per_s": samples_per_s * bytes_per_sample / 1e6,
        "first_batch_s": epochs[0]["first_batch_s"],
        "epoch1_samples_per_s": epochs[0]["samples_per_s"],
        "epochs": epochs,
    }
