"""``cachekit convert``: re-shard a cache into another format or codec without decoding the raw data again.

Converting is a build whose inputs are the source cache's shards: it holds the output folder's
lock, records its plan so that an interrupted run resumes (or, with other options, is cleaned up
by the next one), retires the shards of a cache it replaces instead of deleting them under its
readers, and writes the manifest last. Either side may be an fsspec URL: a source shard on
object storage is fetched into a temporary folder, checked against the manifest's size and
sha256, converted and deleted, one at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
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
from ..constants import DEFAULT_GRACE_SECONDS, MANIFEST_NAME, MANIFEST_VERSION, PARTIAL_DIR
from ..errors import BuildError, CacheError, UsageError
from ..store.atomic import path_size, sha256_path
from ..store.encoding import shaped_store
from ..store.fields import field_columns
from ..store.formats import SHARD_NAME_COLUMN, get_format, identity_column
from ..store.location import commit_index, open_location, read_manifest, write_failure
from ..store.manifest import Manifest, ShardInfo, shard_path
from ..store.manifestio import json_text, manifest_text
from ..store.remote import access_error, fetch_shard, filesystem, is_url, secrets_hidden
from ..store.sourcecol import SOURCE_BYTES, SOURCE_OFFSETS
from .verify import stored_values_problem

__all__ = ["convert"]


def _read_shard(root: Path, manifest: Manifest, index: int) -> dict[str, np.ndarray]:
    """A shard's columns as stored: pixels, or the encoded bytes unchanged (never re-encoded)."""
    info = manifest.shards[index]
    store = manifest.format_options.get("store", "pixels")
    fmt = get_format(manifest.format, reading=True)
    reader = fmt.open(shard_path(root, info), manifest.sample, info.samples, store)
    try:
        problem = stored_values_problem(manifest, info, reader)  # never carried over, as a changed pixel
        if problem:
            raise CacheError(f"{info.file}: {problem}; convert copies only what verify passes")
        rows = np.arange(info.samples)
        if store == "pixels" and not manifest.sample.ragged:
            image_array = reader.image_array
            arrays = {"images": np.array(image_array) if image_array is not None else reader.images(rows)}
        else:
            shaped = manifest.sample.ragged or shaped_store(store)
            names = ["image_bytes", "image_offsets"] + (["image_shape"] if shaped else [])
            arrays = {name: np.array(reader.column(name, slice(None))) for name in names}
        for name in ("labels", *manifest.sample.extras):
            arrays[name] = np.array(reader.column(name, rows))
        for name in (SOURCE_BYTES, SOURCE_OFFSETS, *field_columns(manifest.sample.fields)):
            arrays[name] = np.array(reader.column(name, slice(None)))
        return arrays
    finally:
        reader.close()


def _name(info: ShardInfo, fmt_name: str, extension: str, options: dict) -> str:
    """A converted shard's name: a hash of its source shard's bytes and the target format and options."""
    key = json.dumps([info.sha256, fmt_name, sorted(options.items())])
    return f"shard-{hashlib.sha256(key.encode()).hexdigest()[:20]}{extension}"


class _SourceShards:
    """The source cache's shards as local files: in place for a folder; for a URL fetched one at a
    time into a temporary folder and checked against the manifest's size and sha256 first."""

    def __init__(self, cache: str | Path, manifest: Manifest, storage_options: dict | None) -> None:
        self.cache, self.manifest = cache, manifest
        self.fs = self.root = None
        if isinstance(cache, str):
            self.fs, self.root = filesystem(cache, storage_options)
        elif manifest.index:  # a URL's index was hashed when fetched; a folder's is mapped unhashed
            self._check_index(Path(cache) / manifest.index["file"], manifest.index)

    def _check_index(self, path: Path, record: dict) -> None:
        """The source's index hashed before its columns (sample counts, pixel sums) are carried over."""
        try:
            same = sha256_path(path) == record["sha256"]
        except OSError:
            same = False
        if not same:
            raise CacheError(
                f"{path}: the shard index's bytes do not match the manifest's sha256 (changed since the "
                "cache was built; rebuild the cache or restore the file)"
            )

    @contextlib.contextmanager
    def local(self, index: int) -> Iterator[Path]:
        """A folder holding shard ``index`` under its own name, for as long as the block runs."""
        if self.fs is None:
            info = self.manifest.shards[index]
            self._check(Path(self.cache) / info.file, info)  # a flipped bit is never carried over
            yield Path(self.cache)
            return
        info = self.manifest.shards[index]
        remote = f"{self.root}/{info.file}"
        with tempfile.TemporaryDirectory(prefix="cachekit-convert-") as tmp:
            local = Path(tmp) / info.file
            try:
                fetch_shard(self.fs, remote, local)
            except FileNotFoundError:
                raise CacheError(f"{self.cache}/{info.file}: shard is missing") from None
            except Exception as exc:
                raise access_error(f"{self.cache}/{info.file}", exc, CacheError, "fetch") from None
            self._check(local, info)
            yield Path(tmp)

    def _check(self, path: Path, info) -> None:
        try:
            same = path_size(path) == info.bytes and sha256_path(path) == info.sha256
        except OSError:
            same = False
        if not same:
            raise CacheError(
                f"{self.cache}/{info.file}: its bytes do not match the manifest's size and sha256 "
                "(changed since the cache was built; cachekit verify names every such shard)"
            )


def convert(
    cache: str | os.PathLike,
    out: str | os.PathLike,
    to: str,
    *,
    compression: str = "none",
    overwrite: bool = False,
    grace: float | None = None,
    progress: bool = False,
    storage_options: dict | None = None,
) -> Manifest:
    """Write the samples of ``cache`` as a new cache at ``out`` in format ``to``; pixels are unchanged.

    Re-running an interrupted conversion resumes it. ``overwrite`` replaces a cache in ``out``;
    its shards are retired for ``grace`` seconds (default 24 h), as a build does. ``cache`` and
    ``out`` may be fsspec URLs, reached with ``storage_options`` (never written, never shown).
    """
    with secrets_hidden(storage_options):
        src = str(cache).rstrip("/") if is_url(cache) else Path(cache)
        manifest = read_manifest(src, storage_options=storage_options)
        fmt = get_format(to)
        options = {**manifest.format_options, "compression": compression}
        fmt.check_options(options)
        check_apart(src, out, ("the cache", "--out"))
        location = open_location(out, storage_options)
        location.exists()
        fingerprint = hashlib.sha256(
            f"{manifest.fingerprint}\nconverted to {fmt.name} {sorted(options.items())}".encode()
        ).hexdigest()
        planned = [_name(info, fmt.name, fmt.extension, options) for info in manifest.shards]
        source = _SourceShards(src, manifest, storage_options)
        location.mkdir()
        with location.lock():
            try:
                return _convert(
                    source,
                    location,
                    fmt,
                    options,
                    fingerprint,
                    planned,
                    overwrite,
                    grace,
                    progress,
                    storage_options,
                )
            except BaseException:
                with contextlib.suppress(Exception):  # never hide the error that stopped the conversion
                    remove_temps(location)
                raise


def _convert(
    source, location, fmt, options, fingerprint, planned, overwrite, grace, progress, storage_options
) -> Manifest:
    manifest = source.manifest
    previous, text = existing_cache(location)
    partial = read_partial(location)
    resuming = partial is not None and partial.fingerprint == fingerprint
    referenced = {s.file for s in previous.shards} if previous is not None else recorded_shards(text)
    if previous is not None and previous.index:
        referenced.add(previous.index["file"])
    grace = DEFAULT_GRACE_SECONDS if grace is None else grace
    if partial is None and location.names(PARTIAL_DIR):  # records whose plan is lost (killed while removed)
        remove_unrecorded_plan(location, (), referenced)
    if previous is not None and previous.fingerprint == fingerprint:  # already converted: clean up only
        if partial is not None:
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
            # on object storage a finished shard is kept on its size and recorded sha256, as a build's
            if done is not None and reusable(location, done[0], verify=not is_url(location.url)):
                shards.append(done[0])
                bar.update(info.samples)
                continue
            with source.local(i) as root:
                arrays = _read_shard(root, manifest, i)
            arrays[SHARD_NAME_COLUMN] = identity_column(name)  # its own name, checked on open
            size, digest = commit_shard(location.url, name, fmt.name, arrays, options, storage_options)
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
        format_version=MANIFEST_VERSION,  # written as this version writes (an old cache too: with its index)
    )
    result = commit_index(location, result)
    current = set(planned) | {result.index["file"]}
    retire(location, referenced, current)
    try:
        location.write_text(MANIFEST_NAME, manifest_text(result))
    except OSError as exc:
        raise BuildError(f"cannot write {location.url}/{MANIFEST_NAME}: {write_failure(exc)}") from None
    remove_unrecorded_plan(location, planned, current)
    collect(location, current, grace)
    return result
