"""Synthetic ImageNet-like raw folders: varied, photo-like JPEGs, for benchmarks and demos.

Each image mixes a smooth colour field, random shapes, fine texture and sensor-like noise, so it
compresses and decodes like a photograph (not like a flat colour, which JPEG makes trivially small).
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

__all__ = ["synthetic_image", "make_synthetic_folder", "write_synthetic_cache"]


def synthetic_image(rng: np.random.Generator, height: int = 375, width: int = 500) -> np.ndarray:
    """One photo-like RGB uint8 image ``[H, W, 3]``."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        f = rng.uniform(0.002, 0.02)
        img[..., c] = 128 + 90 * np.sin(f * (a * xx + b * yy) + p * np.pi)
    for _ in range(int(rng.integers(4, 12))):
        colour = tuple(float(v) for v in rng.uniform(0, 255, 3))
        center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        if rng.random() < 0.5:
            axes = tuple(int(rng.integers(max(1, min(10, d // 4)), max(2, d // 3))) for d in (width, height))
            cv2.ellipse(img, center, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1, cv2.LINE_AA)
        else:
            pts = rng.integers(0, [width, height], size=(int(rng.integers(3, 7)), 2)).astype(np.int32)
            cv2.fillPoly(img, [pts], colour, cv2.LINE_AA)
    texture = rng.normal(0, 1, (height // 4 + 1, width // 4 + 1, 3)).astype(np.float32)
    texture = cv2.resize(texture, (width, height), interpolation=cv2.INTER_CUBIC)[:height, :width]
    img += 18 * texture + rng.normal(0, 4, img.shape).astype(np.float32)
    img = cv2.GaussianBlur(img, (0, 0), float(rng.uniform(0.3, 1.2)))
    return np.clip(img, 0, 255).astype(np.uint8)


def _write_images(
    root: Path, start: int, stop: int, classes: int, size, quality: int, seed: int, progress=None
) -> None:
    for i in range(start, stop):
        rng = np.random.default_rng([seed, i])  # image i is the same whoever writes it
        h = int(size[0] * rng.uniform(0.85, 1.15))
        w = int(size[1] * rng.uniform(0.85, 1.15))
        if rng.random() < 0.3:
            h, w = w, h
        rgb = synthetic_image(rng, h, w)
        ok, buf = cv2.imencode(
            ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
        )
        if not ok:  # pragma: no cover - OpenCV always encodes JPEG
            raise RuntimeError("JPEG encoding failed")
        (root / f"class_{i % classes:03d}" / f"img_{i:07d}.jpg").write_bytes(buf.tobytes())
        if progress is not None:
            progress(1)


def make_synthetic_folder(
    root: str | os.PathLike,
    n: int,
    *,
    classes: int = 10,
    size: tuple[int, int] = (375, 500),
    quality: int = 90,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = False,
) -> Path:
    """Write ``n`` JPEGs into ``root/<class>/`` (ImageFolder layout), sizes jittered around ``size``.

    Written by ``workers`` processes (default: the usable CPUs); the files do not depend on it.
    ``progress`` shows a bar on stderr.
    """
    from tqdm import tqdm

    from ..build.executors import run_jobs
    from ..cpus import available_cpus

    root = Path(root)
    for c in range(classes):
        (root / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    workers = workers or available_cpus()
    step = max(16, -(-n // (4 * workers)))
    jobs = [(start, min(n, start + step)) for start in range(0, n, step)]

    job = _WriteJob(root, classes, tuple(size), quality, seed)
    with tqdm(total=n, unit="img", desc="writing JPEGs", disable=not progress, leave=False) as bar:
        for _ in run_jobs(job, jobs, workers=workers, on_progress=bar.update):
            pass
    return root


class _WriteJob:
    """A picklable ``(start, stop) -> None`` writing that range of images (for the process pool)."""

    def __init__(self, root: Path, classes: int, size: tuple[int, int], quality: int, seed: int) -> None:
        self.args = (root, classes, size, quality, seed)

    def __call__(self, job: tuple[int, int], progress=None) -> None:
        root, classes, size, quality, seed = self.args
        _write_images(root, job[0], job[1], classes, size, quality, seed, progress)


def write_synthetic_cache(
    root: str | os.PathLike,
    n: int,
    *,
    side: int = 32,
    shard_size: int = 1000,
    classes: int = 10,
    seed: int = 0,
    format: str = "pt",
    compression: str = "none",
) -> Path:
    """A valid cache of ``n`` random samples in ``format`` (and ``compression``), written without decoding.

    For benchmarks and tests that need many samples or shards (memory, sampler scale, open-file
    limits), not real pictures.
    """
    import hashlib

    from ..store.atomic import commit_file
    from ..store.formats import SHARD_NAME_COLUMN, get_format, identity_column
    from ..store.location import write_manifest
    from ..store.manifest import ArraySpec, Manifest, SampleSpec, ShardInfo

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    spec = SampleSpec(shape=(3, side, side), extras={"orig_size": ArraySpec((2,), "<i4")})
    fmt = get_format(format)
    options = {"compression": compression}
    fmt.check_options(options)
    shards = []
    for start in range(0, n, shard_size):
        k = min(shard_size, n - start)
        images = rng.integers(0, 256, (k, *spec.shape), dtype=np.uint8)
        arrays = {
            "images": images,
            "labels": (np.arange(start, start + k) % classes).astype(np.int64),
            "orig_size": np.full((k, 2), side, dtype=np.int32),
        }
        name = f"shard-{start // shard_size:06d}{fmt.extension}"
        arrays[SHARD_NAME_COLUMN] = identity_column(name)
        size, digest = commit_file(root / name, lambda tmp, a=arrays: fmt.write(tmp, a, options))
        flat = images.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64)
        shards.append(
            ShardInfo(
                file=name,
                samples=k,
                bytes=size,
                sha256=digest,
                inputs=k,
                first=f"synthetic/{start:09d}",
                last=f"synthetic/{start + k - 1:09d}",
                inputs_digest=hashlib.sha256(f"{seed}:{start}:{k}".encode()).hexdigest(),
                pixel_sum=tuple(flat.sum(axis=1).tolist()),
                pixel_sumsq=tuple((flat**2).sum(axis=1).tolist()),
                pixel_count=flat.shape[1],
            )
        )
    manifest = Manifest(
        format=fmt.name,
        sample=spec,
        shards=tuple(shards),
        classes=tuple(f"class_{c:03d}" for c in range(classes)),
        pipeline={"name": "synthetic", "size": side, "steps": []},
        fingerprint=hashlib.sha256(
            f"synthetic:{n}:{side}:{seed}:{shard_size}:{fmt.name}".encode()
        ).hexdigest(),
        mean=(0.5, 0.5, 0.5),
        std=(0.2887, 0.2887, 0.2887),
        format_options={**options, "store": "pixels", "shard_size": shard_size},
        source={"layout": "synthetic", "inputs": n},
    )
    write_manifest(root, manifest)
    return root
