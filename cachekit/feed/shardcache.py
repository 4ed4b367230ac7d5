"""Whole shards of caches on object storage, kept on local disk: at most a byte budget of them, LRU.

The first time a process touches a shard of a remote cache it is fetched whole (fsspec's ranged,
parallel GETs), checked against the manifest's size and sha256, and kept here; from there it is
memory-mapped like any local shard.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..constants import env_int
from ..errors import CacheError, UsageError
from ..store.atomic import path_size, remove_path, sha256_path
from ..store.manifest import ShardInfo

__all__ = ["ShardCache", "DEFAULT_LOCAL_CACHE_BYTES"]

#: Default bound of the local shard cache (bytes); CACHEKIT_LOCAL_CACHE_BYTES overrides it.
DEFAULT_LOCAL_CACHE_BYTES = env_int("CACHEKIT_LOCAL_CACHE_BYTES", 20 * 1024**3)


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
