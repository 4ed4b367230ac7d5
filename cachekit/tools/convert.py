"""``cachekit convert``: re-shard a cache into another format or codec without decoding the raw data again.

Converting is a build whose inputs are the source cache's shards: it holds the output folder's
lock, records its plan so that an interrupted run resumes (or, with other options, is cleaned up
by the next one), retires the shards of a cache it replaces instead of deleting them under its
readers, and writes the manifest last.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from ..build.guards import check_apart
from ..build.resume import existing_cache, read_partial, reusable, start_partial
from ..build.retire import (
    collect,
    is_own_record,
    recorded_shards,
    remove_temps,
    remove_unrecorded_plan,
    retire,
)
from ..build.shardwrite import commit_shard
from ..constants import DEFAULT_GRACE_SECONDS, MANIFEST_NAME, PARTIAL_DIR
from ..errors import BuildError, UsageError
from ..store.formats import SHARD_NAME_COLUMN, get_format, identity_column
from ..store.location import LocalLocation, read_manifest, write_failure
from ..store.manifest import Manifest, ShardInfo, json_text, manifest_text, shard_path
from ..store.sourcecol import SOURCE_BYTES, SOURCE_OFFSETS

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
        for name in (SOURCE_BYTES, SOURCE_OFFSETS):
            arrays[name] = np.array(reader.column(name, slice(None)))
        return arrays
    finally:
        reader.close()


def _name(info: ShardInfo, fmt_name: str, extension: str, options: dict) -> str:
    """A converted shard's name: a hash of its source shard's bytes and the target format and options."""
    key = json.dumps([info.sha256, fmt_name, sorted(options.items())])
    return f"shard-{hashlib.sha256(key.encode()).hexdigest()[:20]}{extension}"


def convert(
    cache: str | os.PathLike,
    out: str | os.PathLike,
    to: str,
    *,
    compression: str = "none",
    overwrite: bool = False,
    grace: float | None = None,
    progress: bool = False,
) -> Manifest:
    """Write the samples of ``cache`` as a new cache at ``out`` in format ``to``; pixels are unchanged.

    Re-running an interrupted conversion resumes it. ``overwrite`` replaces a cache in ``out``;
    its shards are retired for ``grace`` seconds (default 24 h), as a build does.
    """
    src, dst = Path(cache), Path(out)
    manifest = read_manifest(src)
    fmt = get_format(to)
    options = {**manifest.format_options, "compression": compression}
    fmt.check_options(options)
    check_apart(src, dst, ("the cache", "--out"))
    location = LocalLocation(dst)
    location.exists()
    fingerprint = hashlib.sha256(
        f"{manifest.fingerprint}\nconverted to {fmt.name} {sorted(options.items())}".encode()
    ).hexdigest()
    planned = [_name(info, fmt.name, fmt.extension, options) for info in manifest.shards]
    location.mkdir()
    with location.lock():
        try:
            return _convert(
                src, manifest, location, fmt, options, fingerprint, planned, overwrite, grace, progress
            )
        except BaseException:
            with contextlib.suppress(Exception):  # never hide the error that stopped the conversion
                remove_temps(location)
            raise


def _convert(
    src, manifest, location, fmt, options, fingerprint, planned, overwrite, grace, progress
) -> Manifest:
    previous, text = existing_cache(location)
    partial = read_partial(location)
    resuming = partial is not None and partial.fingerprint == fingerprint
    referenced = {s.file for s in previous.shards} if previous is not None else recorded_shards(text)
    grace = DEFAULT_GRACE_SECONDS if grace is None else grace
    if previous is not None and previous.fingerprint == fingerprint:  # already converted: clean up only
        if resuming:
            remove_unrecorded_plan(location, partial.planned, referenced)
        remove_temps(location)
        collect(location, referenced, grace)
        return previous
    if not overwrite and not resuming and any(not is_own_record(n) for n in location.names()):
        raise UsageError(f"--out {location.url} is not empty; pass --overwrite to replace it")
    if partial is not None and not resuming:
        remove_unrecorded_plan(location, partial.planned, referenced)
        partial = None
    remove_temps(location)
    finished = partial.finished if partial is not None else {}
    start_partial(location, fingerprint, planned)
    from tqdm import tqdm

    shards = []
    with tqdm(
        total=manifest.num_samples,
        unit="img",
        desc="convert",
        disable=not progress,
        dynamic_ncols=True,
        mininterval=0.5,
        file=sys.stderr,
    ) as bar:
        for i, (info, name) in enumerate(zip(manifest.shards, planned)):
            done = finished.get(name)
            if done is not None and reusable(location, done[0], verify=True):
                shards.append(done[0])
                bar.update(info.samples)
                continue
            arrays = _read_shard(src, manifest, i)
            arrays[SHARD_NAME_COLUMN] = identity_column(name)  # its own name, checked on open
            size, digest = commit_shard(location.url, name, fmt.name, arrays, options)
            converted = replace(info, file=name, bytes=size, sha256=digest)
            try:
                location.write_text(
                    f"{PARTIAL_DIR}/{name}.json", json_text({"info": converted.to_json(), "skipped": []})
                )
            except OSError as exc:
                raise BuildError(f"cannot write to {location.url}: {write_failure(exc)}") from None
            shards.append(converted)
            bar.update(info.samples)
    result = replace(
        manifest,
        format=fmt.name,
        format_options=options,
        shards=tuple(shards),
        fingerprint=fingerprint,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    current = set(planned)
    retire(location, referenced, current)
    try:
        location.write_text(MANIFEST_NAME, manifest_text(result))
    except OSError as exc:
        raise BuildError(f"cannot write {location.url}/{MANIFEST_NAME}: {write_failure(exc)}") from None
    remove_unrecorded_plan(location, planned, current)
    collect(location, current, grace)
    return result
