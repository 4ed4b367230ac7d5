"""Caches on object storage (``s3://``, ``gs://``, ``memory://`` ... through fsspec).

A remote cache is read shard by shard: the first time a process touches a shard it is fetched
whole (fsspec's ranged, parallel GETs), checked against the manifest's size and sha256, and kept
in a local folder bounded in size, least recently used first out; from there it is memory-mapped
like any local shard. Credentials come from the usual fsspec/boto environment, never from the
cache.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .atomic import path_size, remove_path, sha256_path
from .constants import MANIFEST_NAME, env_int
from .errors import CacheError, UsageError
from .manifest import Manifest, ShardInfo, parse_manifest

__all__ = ["is_url", "filesystem", "ShardCache", "DEFAULT_LOCAL_CACHE_BYTES", "read_remote_manifest"]

#: Default bound of the local shard cache (bytes); CACHEKIT_LOCAL_CACHE_BYTES overrides it.
DEFAULT_LOCAL_CACHE_BYTES = env_int("CACHEKIT_LOCAL_CACHE_BYTES", 20 * 1024**3)


def is_url(path: str | os.PathLike) -> bool:
    """True for ``scheme://...`` locations (``file://`` included), False for plain paths."""
    return "://" in str(path)


def filesystem(url: str):
    """``(fsspec filesystem, path inside it)`` for ``url``, with an install hint when it is missing."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise UsageError(f"{url}: remote caches need fsspec: pip install 'cachekit[remote]'") from None
    try:
        fs, path = url_to_fs(url)
    except ImportError as exc:
        raise UsageError(f"{url}: {exc} (for s3:// pip install 'cachekit[remote]')") from None
    except ValueError as exc:
        raise UsageError(f"{url}: {exc}") from None
    return fs, path.rstrip("/")


class ShardCache:
    """Whole shards of remote caches on local disk, at most ``max_bytes`` of them, LRU."""

    def __init__(self, folder: str | os.PathLike | None = None, max_bytes: int | None = None) -> None:
        self.folder = (
            Path(folder) if folder else Path(tempfile.gettempdir()) / f"cachekit-shards-{os.getuid()}"
        )
        self.max_bytes = DEFAULT_LOCAL_CACHE_BYTES if max_bytes is None else int(max_bytes)
        if self.max_bytes <= 0:
            raise UsageError("local_cache_bytes must be positive")

    def local(self, fs, remote_root: str, fingerprint: str, info: ShardInfo) -> Path:
        """The local copy of shard ``info`` of the remote cache at ``remote_root``; fetched if needed."""
        folder = self.folder / fingerprint[:24]
        path = folder / info.file
        if path.exists() and path_size(path) == info.bytes:
            os.utime(path)  # most recently used
            return path
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{info.file}.{os.getpid()}.part"
        remote = f"{remote_root}/{info.file}"
        try:
            if fs.isdir(remote):
                fs.get(remote + "/", str(tmp), recursive=True)
            else:
                fs.get_file(remote, str(tmp))
        except FileNotFoundError:
            remove_path(tmp)
            raise CacheError(f"{remote}: shard is missing") from None
        except OSError as exc:
            remove_path(tmp)
            raise CacheError(f"{remote}: cannot be fetched ({exc})") from None
        if path_size(tmp) != info.bytes or sha256_path(tmp) != info.sha256:
            remove_path(tmp)
            raise CacheError(f"{remote}: fetched bytes do not match the manifest's size and sha256")
        if path.exists():
            remove_path(path)
        os.replace(tmp, path)
        self._evict(keep=path)
        return path

    def _evict(self, keep: Path) -> None:
        entries = []
        for fp in self.folder.iterdir():
            if fp.is_dir():
                entries += [e for e in fp.iterdir() if not e.name.startswith(".")]
        sized = sorted(((e.stat().st_mtime, path_size(e), e) for e in entries), key=lambda t: t[0])
        total = sum(size for _, size, _ in sized)
        for _, size, entry in sized:
            if total <= self.max_bytes:
                break
            if entry != keep:
                # an open reader keeps its memory map: removing the file does not disturb it
                remove_path(entry)
                total -= size


def read_remote_manifest(url: str) -> Manifest:
    """Read and validate ``URL/manifest.json`` through fsspec."""
    fs, root = filesystem(url)
    try:
        text = fs.cat_file(f"{root}/{MANIFEST_NAME}").decode("utf-8")
    except FileNotFoundError:
        raise CacheError(f"{url}: no {MANIFEST_NAME} (not a cache, or its build has not finished)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheError(f"{url}/{MANIFEST_NAME}: cannot be read: {exc}") from None
    return parse_manifest(text, f"{url}/{MANIFEST_NAME}")
