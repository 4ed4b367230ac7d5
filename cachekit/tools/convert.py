"""``cachekit convert``: re-shard a cache into another format or codec without decoding the raw data again."""

from __future__ import annotations

import hashlib
import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ..constants import LOCK_NAME
from ..errors import BuildError, UsageError
from ..store.atomic import commit_file
from ..store.formats import SHARD_NAME_COLUMN, get_format, identity_column
from ..store.location import read_manifest
from ..store.lock import BuildLock
from ..store.manifest import Manifest, shard_path, write_manifest

__all__ = ["convert"]


def _read_shard(root: Path, manifest: Manifest, index: int) -> dict[str, np.ndarray]:
    """A shard's columns as stored: pixels, or the encoded bytes unchanged (never re-encoded)."""
    info = manifest.shards[index]
    store = manifest.format_options.get("store", "pixels")
    fmt = get_format(manifest.format, reading=True)
    reader = fmt.open(shard_path(root, info), manifest.sample, info.samples, store)
    try:
        rows = np.arange(info.samples)
        if store == "pixels" and not manifest.sample.ragged:
            image_array = reader.image_array
            arrays = {"images": np.array(image_array) if image_array is not None else reader.images(rows)}
        else:
            names = ["image_bytes", "image_offsets"] + (["image_shape"] if manifest.sample.ragged else [])
            arrays = {name: np.array(reader.column(name, slice(None))) for name in names}
        for name in ("labels", *manifest.sample.extras):
            arrays[name] = np.array(reader.column(name, rows))
        return arrays
    finally:
        reader.close()


def convert(
    cache: str | os.PathLike,
    out: str | os.PathLike,
    to: str,
    *,
    compression: str = "none",
    overwrite: bool = False,
) -> Manifest:
    """Write the samples of ``cache`` as a new cache at ``out`` in format ``to``; pixels are unchanged."""
    src, dst = Path(cache), Path(out)
    manifest = read_manifest(src)
    fmt = get_format(to)
    options = {**manifest.format_options, "compression": compression}
    fmt.check_options(options)
    if dst.resolve() == src.resolve():
        raise UsageError("--out must be a different folder from the cache being converted")
    if dst.exists() and any(p.name != LOCK_NAME for p in dst.iterdir()) and not overwrite:
        raise UsageError(f"--out {dst} is not empty; pass --overwrite to replace it")
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot create {dst}: {exc.strerror}") from None
    with BuildLock(dst):
        shards = []
        for i, info in enumerate(manifest.shards):
            arrays = _read_shard(src, manifest, i)
            name = f"{Path(info.file).stem}{fmt.extension}"
            arrays[SHARD_NAME_COLUMN] = identity_column(name)
            try:
                size, digest = commit_file(dst / name, lambda tmp, a=arrays: fmt.write(tmp, a, options))
            except OSError as exc:
                raise BuildError(f"cannot write {dst / name}: {exc.strerror or exc}") from None
            shards.append(replace(info, file=name, bytes=size, sha256=digest))
        fingerprint = hashlib.sha256(
            f"{manifest.fingerprint}\nconverted to {fmt.name} {sorted(options.items())}".encode()
        ).hexdigest()
        converted = replace(
            manifest,
            format=fmt.name,
            format_options=options,
            shards=tuple(shards),
            fingerprint=fingerprint,
            created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        )
        write_manifest(dst, converted)
    return converted
