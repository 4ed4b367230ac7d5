"""Where a cache is and what it holds: a local folder, one split of a folder of split caches, or a
cache on object storage fetched shard by shard into the node's cache (``stream.remotecache``).
``CachedDataset`` opens its cache here; a local shard's path is checked here when a reader first
opens it (never every shard at start-up)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import CacheError
from ..store.location import read_manifest
from ..store.manifest import Manifest, shard_path
from ..store.remote import is_url
from ..store.splitdirs import split_path, splits_error
from ..stream.remotecache import RemoteShards, index_folder

__all__ = ["OpenedCache", "open_cache", "checked_shard_path"]


@dataclass(frozen=True)
class OpenedCache:
    """``url`` (None for a local folder), ``root`` (the folder shards are read from: the node's cache
    for a URL), ``manifest``, and ``remote`` (the node's shard cache of a URL, else None)."""

    url: str | None
    root: Path
    manifest: Manifest
    remote: RemoteShards | None


def open_cache(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    storage_options: dict | None = None,
    local_cache: str | os.PathLike | None = None,
    local_cache_bytes: int | None = None,
) -> OpenedCache:
    """The cache at ``path`` (its ``split`` of a folder of split caches), its manifest read and checked."""
    if split is not None:  # one cache of a folder of split caches (a build of a RAW naming splits)
        path = split_path(path, split)
    url = str(path).rstrip("/") if is_url(path) else None
    if url is None:
        if split is None and (error := splits_error(path)) is not None:
            raise error
        return OpenedCache(None, Path(path), read_manifest(Path(path)), None)
    manifest = read_manifest(url, storage_options=storage_options, index_folder=index_folder(local_cache))
    remote = RemoteShards(
        url, manifest, storage_options=storage_options, local_cache=local_cache, local_cache_bytes=local_cache_bytes
    )
    return OpenedCache(url, remote.cache.folder, manifest, remote)


def checked_shard_path(root: Path, info) -> Path:
    """A local shard's path, checked when a reader first opens it: a regular file or folder of files
    inside the cache, of the manifest's size."""
    try:
        path = shard_path(root, info)
        size = path.stat().st_size if path.is_file() else None
    except CacheError as exc:
        raise CacheError(f"{root}: shard {info.file} {exc}") from None
    except OSError as exc:
        raise CacheError(f"{root}: shard {info.file} cannot be read ({exc.strerror or exc})") from None
    if size is not None and size != info.bytes:
        raise CacheError(
            f"{root}: shard {info.file} is {size} bytes, the manifest says {info.bytes} "
            "(changed since the build: rebuild, or restore it)"
        )
    return path
