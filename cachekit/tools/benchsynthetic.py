"""``cachekit bench --synthetic N``: ImageNet-like JPEGs and caches built from them, compared in one run.

Plain runs build a ``classification-224`` cache per format (fixed 224x224 samples, what the raw
rows' recipe makes). With ``augment`` the caches are ``train-256`` instead (shorter side 256, no
crop: the recipe meant for random crops at read time), so the comparison is the training one:
RandomResizedCrop + flip from the raw files against the same from the cache. With ``boxes`` the
images hold objects with YOLO labels (``synthetic_objects``) and the caches are detection caches
(``letterbox-640`` with their boxes, ``--annotations yolo``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ..constants import DEFAULT_PIPELINE
from ..errors import BuildError, UsageError
from .bench import BenchConfig, run_bench

__all__ = ["bench_synthetic", "AUGMENT_PIPELINE", "SYNTHETIC_FORMATS"]

#: The recipe of the caches an augmented synthetic run builds.
AUGMENT_PIPELINE = "train-256"
#: The recipe of the detection caches a synthetic run with boxes builds.
BOXES_PIPELINE = "letterbox-640"
#: The formats a synthetic run builds, plain or augmented (three builds of 1000 images take
#: seconds, and their rows about a third of an augmented run's measuring time).
SYNTHETIC_FORMATS = ("pt", "hdf5", "zarr")


def bench_synthetic(
    n: int,
    config: BenchConfig = BenchConfig(),
    *,
    workdir: str | os.PathLike | None = None,
    formats: Sequence[str] | None = None,
    keep: bool = False,
    log: Callable[[str], None] = lambda line: None,
    progress: bool = False,
    boxes: bool = False,
) -> dict:
    """Generate ``n`` ImageNet-like JPEGs, build a cache per format, and run the comparison.

    The caches are ``train-256`` when ``config.augment``, else ``classification-224``; a kept
    ``workdir`` holds both kinds side by side (``cache-<format>``, ``train256-<format>``).
    """
    from ..build.run import BuildConfig, build
    from .synthetic import make_synthetic_folder
    from .synthetic_objects import make_object_dataset

    if n < 1:
        raise UsageError("--synthetic needs at least 1 image")
    config.check()  # before minutes of writing and building
    formats = tuple(formats) if formats is not None else SYNTHETIC_FORMATS
    pipeline = BOXES_PIPELINE if boxes else AUGMENT_PIPELINE if config.augment else DEFAULT_PIPELINE
    prefix = "boxes" if boxes else "train256" if config.augment else "cache"
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="cachekit-bench-"))
    try:
        raw = root / ("objects" if boxes else "raw")
        if not raw.is_dir() or sum(1 for _ in raw.rglob("*.jpg")) != n:
            shutil.rmtree(raw, ignore_errors=True)
            log(f"writing {n} synthetic JPEGs (about 500x375{' with objects' if boxes else ''}) to {raw}")
            try:
                if boxes:
                    make_object_dataset(raw, n, size=(375, 500), ext=".jpg")
                else:
                    make_synthetic_folder(raw, n, classes=min(10, n), progress=progress)
            except OSError as exc:
                reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
                raise BuildError(f"cannot write the synthetic images to {raw}: {reason}") from None
        caches, builds = [], []
        for fmt in formats:
            out = root / f"{prefix}-{fmt}"
            log(f"building the {fmt} cache ({pipeline}) in {out}")
            options = {"annotations": "yolo"} if boxes else {}
            result = build(
                raw,
                out,
                BuildConfig(format=fmt, pipeline=pipeline, overwrite=True, progress=progress, **options),
            )
            caches.append(out)
            builds.append(
                {
                    "format": fmt,
                    "pipeline": pipeline,
                    "status": result.status,
                    "seconds": result.seconds,
                    "images_per_s": result.manifest.num_samples / result.seconds,
                    "bytes": result.manifest.total_bytes,
                }
            )
        report = run_bench(raw, caches, config, log=log, progress=progress)
        report["builds"] = builds
        report["synthetic"] = {"images": n, "workdir": str(root), "kept": keep, "boxes": boxes}
        return report
    finally:
        if not keep and not workdir:
            shutil.rmtree(root, ignore_errors=True)
